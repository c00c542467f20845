SELECT sendonce_suppress_rows($1::uuid[], $2, $3::text[], $4::text[])
