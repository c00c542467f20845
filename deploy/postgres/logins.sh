#!/bin/sh
# Creates (or updates the password of) the runtime login roles of a
# sendonce deployment, each a member of a NOLOGIN role the migrations
# create: relay_login IN ROLE sendonce_relay, sender_login IN ROLE
# sendonce_sender, receiver_login IN ROLE sendonce_receiver. Run after
# relay migrate, as the owner; docker-compose runs it as db-logins with the
# passwords from /run/secrets. Safe to run again.
set -eu
secrets=${SECRETS_DIR:-/run/secrets}
PGPASSWORD=$(cat "$secrets/pg_owner_password")
export PGPASSWORD
for r in relay sender receiver; do
  # The password reaches psql through the environment (\getenv), never
  # its command line.
  LOGIN_PASSWORD=$(cat "$secrets/pg_${r}_password") LOGIN_ROLE="${r}_login" GROUP_ROLE="sendonce_${r}" \
    psql -X -q -v ON_ERROR_STOP=1 <<'SQL'
\getenv login LOGIN_ROLE
\getenv grp GROUP_ROLE
\getenv pw LOGIN_PASSWORD
SELECT format('CREATE ROLE %I LOGIN IN ROLE %I', :'login', :'grp')
  WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = :'login') \gexec
SELECT format('ALTER ROLE %I LOGIN PASSWORD %L', :'login', :'pw') \gexec
SQL
done
echo "login roles ready: relay_login, sender_login, receiver_login"
