SELECT receipt, prev_status, moved, refused
FROM sendonce_apply_receipts($1::uuid[], $2::text[], $3::text[], $4::int[], $5::timestamptz[], $6::text[], $7::text[])
