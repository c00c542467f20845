SELECT extract(epoch FROM now() - sendonce_oldest_transaction())
