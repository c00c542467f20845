// Signs Sinch SMS callbacks the way Sinch signs them (the base64
// HMAC-SHA256, under the callback secret, of "<raw body>.<nonce>.<timestamp>",
// in the headers x-sinch-webhook-signature, -nonce, -timestamp and
// -algorithm HmacSHA256), for the receiver's tests, and asks Sinch's own
// SDK (@sinch/sms SmsCallbackWebhooks.validateAuthenticationHeader) whether
// each callback is validly signed with the secret.
//
// Input (stdin): a JSON list of cases {"body": "<raw body>", "timestamp":
// "<unix seconds, default now>", "nonce": <default random>, "sign_with":
// <another secret>}. Environment: SINCH_CALLBACK_SECRET. Output (stdout): a
// JSON list of {"headers": {...}, "sdk_verified"}.
'use strict';
const crypto = require('node:crypto');
const fs = require('node:fs');
const { SmsCallbackWebhooks } = require('@sinch/sdk-core');

const secret = process.env.SINCH_CALLBACK_SECRET;
if (!secret) {
  console.error('SINCH_CALLBACK_SECRET is not set');
  process.exit(2);
}
const sdk = new SmsCallbackWebhooks(secret);
const cases = JSON.parse(fs.readFileSync(0, 'utf8'));
const out = cases.map((c) => {
  const nonce = c.nonce ?? crypto.randomBytes(13).toString('hex').toUpperCase();
  const timestamp = c.timestamp ?? String(Math.floor(Date.now() / 1000));
  const signature = crypto.createHmac('sha256', c.sign_with ?? secret)
    .update(`${c.body}.${nonce}.${timestamp}`, 'utf8').digest('base64');
  const headers = {
    'x-sinch-webhook-signature': signature,
    'x-sinch-webhook-signature-nonce': nonce,
    'x-sinch-webhook-signature-timestamp': timestamp,
    'x-sinch-webhook-signature-algorithm': 'HmacSHA256',
  };
  return { headers, sdk_verified: sdk.validateAuthenticationHeader(headers, c.body) };
});
process.stdout.write(JSON.stringify(out));
