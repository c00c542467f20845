SELECT seq, source, coalesce(provider, ''), reason, added_by, added_at FROM sendonce_suppression_of($1)
