// Signs Vonage Messages API status webhooks the way Vonage documents its
// signed webhooks (an HS256 JWT under the signature secret, with iat, jti,
// iss "Vonage", api_key, application_id and payload_hash, the hex SHA-256
// of the body), for the receiver's tests, and asks Vonage's own SDK
// (@vonage/jwt verifySignature) whether each token is validly signed with
// the secret.
//
// Input (stdin): a JSON list of cases {"body": "<raw body>", "iat": <unix
// seconds, default now>, "exp": <unix seconds, optional>, "payload_hash":
// <override>, "sign_with": <another secret>}. Environment:
// VONAGE_SIGNATURE_SECRET. Output (stdout): a JSON list of {"token",
// "sdk_verified"}.
'use strict';
const crypto = require('node:crypto');
const fs = require('node:fs');
const jwt = require('jsonwebtoken');
const { verifySignature } = require('@vonage/jwt');

const secret = process.env.VONAGE_SIGNATURE_SECRET;
if (!secret) {
  console.error('VONAGE_SIGNATURE_SECRET is not set');
  process.exit(2);
}
const cases = JSON.parse(fs.readFileSync(0, 'utf8'));
const out = cases.map((c) => {
  const claims = {
    iat: c.iat ?? Math.floor(Date.now() / 1000),
    jti: crypto.randomUUID(),
    iss: 'Vonage',
    payload_hash: c.payload_hash ?? crypto.createHash('sha256').update(c.body, 'utf8').digest('hex'),
    api_key: 'abcd1234',
    application_id: 'aaaaaaaa-bbbb-cccc-dddd-0123456789ab',
  };
  if (c.exp !== undefined) claims.exp = c.exp;
  const token = jwt.sign(claims, c.sign_with ?? secret, { algorithm: 'HS256' });
  return { token, sdk_verified: verifySignature(token, secret) };
});
process.stdout.write(JSON.stringify(out));
