SELECT sendonce_suppress_remove($1, $2, $3, 'operator')
