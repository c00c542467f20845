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
  nats_route_password sms_api_key sms_webhook_secret; do
  put "$name" "$(rand)"
done
dsn() { # login password-file
  echo "postgres://$1:$(cat "secrets/$2")@postgres:5432/sendonce?sslmode=disable"
}
put owner_database_url "$(dsn sendonce pg_owner_password)"
for r in relay sender receiver; do
  put "${r}_database_url" "$(dsn "${r}_login" "pg_${r}_password")"
done
# The cluster profile's routes: a CA of their own and one certificate for
# the three nodes, used by each to accept a route and to dial one (a
# 10-year laptop CA; in production use your PKI and a certificate a node).
if [ ! -s secrets/nats_route_cert.pem ]; then
  tmp=$(mktemp -d)
  openssl req -x509 -new -nodes -newkey ec -pkeyopt ec_paramgen_curve:P-256 \
    -keyout "$tmp/ca.key" -out secrets/nats_route_ca.pem -days 3650 \
    -subj "/CN=sendonce NATS routes CA" 2>/dev/null
  openssl req -new -nodes -newkey ec -pkeyopt ec_paramgen_curve:P-256 \
    -keyout secrets/nats_route_key.pem -out "$tmp/route.csr" -subj "/CN=sendonce NATS route" 2>/dev/null
  printf '%s\n' "subjectAltName=DNS:nats-1,DNS:nats-2,DNS:nats-3" \
    "extendedKeyUsage=serverAuth,clientAuth" "keyUsage=digitalSignature" >"$tmp/ext"
  openssl x509 -req -in "$tmp/route.csr" -CA secrets/nats_route_ca.pem -CAkey "$tmp/ca.key" \
    -CAserial "$tmp/ca.srl" -CAcreateserial -out secrets/nats_route_cert.pem -days 3650 -extfile "$tmp/ext" 2>/dev/null
  rm -rf "$tmp" # the CA's key: a new certificate means a new CA here
  chmod 644 secrets/nats_route_ca.pem secrets/nats_route_cert.pem secrets/nats_route_key.pem
fi
echo "secrets in $(pwd)/secrets"
