-- Nothing to undo: the functions, triggers and view of 0023 do what those
-- of 0018, 0014, 0007 and 0022 did, with every name qualified, and the
-- release before 0023 runs on them. Putting the unqualified ones back
-- would only open them to functions planted in a schema others may create
-- in. The down files of 0022 and 0018 replace or drop them in turn.
SELECT 1;
