SELECT sendonce_purge($1::interval, $2)
