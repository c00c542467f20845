SELECT sendonce_suppress_inbound($1, $2, $3, $4)
