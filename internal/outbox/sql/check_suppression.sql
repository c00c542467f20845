SELECT seq, number_masked, source, coalesce(provider, ''), reason, added_by, added_at
FROM sendonce_suppression_check($1)
