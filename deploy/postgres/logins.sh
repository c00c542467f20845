#!/bin/sh
# Creates (or updates the password of) the runtime login roles of a
# sendonce deployment, each a member of a NOLOGIN role the migrations
# create: relay_login IN ROLE sendonce_relay, sender_login IN ROLE
# sendonce_sender, receiver_login IN ROLE sendonce_receiver. Run after
# relay migrate, as the owner; docker-compose runs it as db-logins with the
# passwords from /run/secrets. Safe to run again.
#
# No password reaches the server: "relay scram-verifier" (the relay binary
# on PATH; docker-compose's db-logins image holds it) reads each one on its
# stdin and prints its SCRAM-SHA-256 verifier with a fresh salt, and only
# that verifier is sent (ALTER ROLE ... PASSWORD 'SCRAM-SHA-256$...'), so
# the server's log (log_statement), pg_stat_activity and any error show the
# verifier at most. Neither the password nor the verifier is on a command
# line. e2e/logins_test.go runs this script.
set -eu
secrets=${SECRETS_DIR:-/run/secrets}
PGPASSWORD=$(cat "$secrets/pg_owner_password")
export PGPASSWORD
for r in relay sender receiver; do
  verifier=$(relay scram-verifier <"$secrets/pg_${r}_password")
  case $verifier in
  'SCRAM-SHA-256$'*) ;;
  *) echo "relay scram-verifier gave no verifier for ${r}_login" >&2; exit 1 ;;
  esac
  # The verifier reaches psql through the environment (\getenv).
  LOGIN_VERIFIER=$verifier LOGIN_ROLE="${r}_login" GROUP_ROLE="sendonce_${r}" \
    psql -X -q -v ON_ERROR_STOP=1 <<'SQL'
\getenv login LOGIN_ROLE
\getenv grp GROUP_ROLE
\getenv verifier LOGIN_VERIFIER
SELECT format('CREATE ROLE %I LOGIN IN ROLE %I', :'login', :'grp')
  WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = :'login') \gexec
SELECT format('ALTER ROLE %I LOGIN PASSWORD %L', :'login', :'verifier') \gexec
SQL
done
echo "login roles ready: relay_login, sender_login, receiver_login"
