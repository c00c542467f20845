SELECT sendonce_suppress_add($1::text[], $2, $3, $4)
