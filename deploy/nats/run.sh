#!/bin/sh
# Starts nats-server with the users' passwords that auth.conf refers to,
# read from the compose secrets in /run/secrets (never from compose's
# environment, which docker inspect shows).
set -eu
for u in admin relay sender operator; do
  v=$(echo "$u" | tr 'a-z' 'A-Z')
  export "NATS_${v}_PASSWORD=$(cat "/run/secrets/nats_${u}_password")"
done
exec nats-server "$@"
