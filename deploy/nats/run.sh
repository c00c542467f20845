#!/bin/sh
# Starts nats-server with the users' passwords that auth.conf refers to,
# read from the compose secrets in /run/secrets (never from compose's
# environment, which docker inspect shows).
#
# For a cluster node (cluster.conf), also the routes' password and TLS
# files, and the route URLs of the nodes named in NATS_ROUTE_HOSTS
# (default "nats-1 nats-2 nats-3", port 6222), each carrying the route
# user and password.
set -eu
secrets=${SECRETS_DIR:-/run/secrets}
for u in admin relay sender operator; do
  v=$(echo "$u" | tr 'a-z' 'A-Z')
  export "NATS_${v}_PASSWORD=$(cat "$secrets/nats_${u}_password")"
done
if [ -f "$secrets/nats_route_password" ]; then
  NATS_ROUTE_PASSWORD=$(cat "$secrets/nats_route_password")
  # It goes into URLs as it is: refuse what would need escaping.
  case $NATS_ROUTE_PASSWORD in
  '' | *[!A-Za-z0-9._~-]*)
    echo "run.sh: nats_route_password must be non-empty and hold only A-Z a-z 0-9 . _ ~ -" >&2
    exit 1
    ;;
  esac
  export NATS_ROUTE_PASSWORD
  export NATS_ROUTE_CERT="${NATS_ROUTE_CERT:-$secrets/nats_route_cert}"
  export NATS_ROUTE_KEY="${NATS_ROUTE_KEY:-$secrets/nats_route_key}"
  export NATS_ROUTE_CA="${NATS_ROUTE_CA:-$secrets/nats_route_ca}"
  i=0
  for h in ${NATS_ROUTE_HOSTS:-nats-1 nats-2 nats-3}; do
    i=$((i + 1))
    export "NATS_ROUTE_$i=nats-route://route:$NATS_ROUTE_PASSWORD@$h:6222"
  done
  if [ "$i" -ne 3 ]; then
    echo "run.sh: NATS_ROUTE_HOSTS names $i nodes; cluster.conf lists 3 routes (edit both)" >&2
    exit 1
  fi
fi
exec nats-server "$@"
