SELECT added_source, coalesce(added_provider, ''), added_reason, added_by, added_at,
	removed_at, removed_by, removed_via, reason
FROM sendonce_suppression_removed($1)
