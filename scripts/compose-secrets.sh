#!/bin/sh
# Writes the secrets docker-compose.yml reads into ./secrets: a random
# password or key each, and the DSNs built from them. An existing file is
# kept, so running it again changes nothing. LAPTOP ONLY: the DSNs use
# sslmode=disable; in production take the secrets from your secret store.
set -eu
cd "$(dirname "$0")/.."
umask 077
mkdir -p secrets
chmod 700 secrets
rand() { od -An -N24 -tx1 /dev/urandom | tr -d ' \n'; }
put() { # name value: written once, readable by the containers' non-root
  # user (the directory keeps other users of this machine out)
  if [ ! -s "secrets/$1" ]; then
    printf '%s\n' "$2" >"secrets/$1"
    chmod 644 "secrets/$1"
  fi
}
for name in pg_owner_password pg_relay_password pg_sender_password pg_receiver_password \
  nats_admin_password nats_relay_password nats_sender_password nats_operator_password \
  sms_api_key sms_webhook_secret; do
  put "$name" "$(rand)"
done
dsn() { # login password-file
  echo "postgres://$1:$(cat "secrets/$2")@postgres:5432/sendonce?sslmode=disable"
}
put owner_database_url "$(dsn sendonce pg_owner_password)"
for r in relay sender receiver; do
  put "${r}_database_url" "$(dsn "${r}_login" "pg_${r}_password")"
done
echo "secrets in $(pwd)/secrets"
