SELECT id, status, publish_gen, coalesce(end_reason, ''), held FROM sendonce_replay_rows($1)
