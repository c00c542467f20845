// Signs Telnyx webhooks the way Telnyx documents its signed webhooks (an
// Ed25519 signature, in base64, of "<timestamp>|<raw body>" under the
// account's key pair, sent in telnyx-signature-ed25519 beside
// telnyx-timestamp), for the receiver's tests, and asks Telnyx's own SDK
// (the telnyx package's TelnyxWebhook.verify) whether each webhook, as
// posted, verifies under the account's public key.
//
// The account's key pair is made here, and so is a second one that stands
// for anyone else's. Input (stdin): a JSON list of cases {"body": "<raw
// body signed>", "send": "<raw body posted, default body>", "timestamp":
// <unix seconds, default now>, "other_key": <sign with the other key>}.
// Output (stdout): {"public_key": "<account public key, base64>",
// "webhooks": [{"signature", "timestamp", "sdk_verified"}]}.
'use strict';
const crypto = require('node:crypto');
const fs = require('node:fs');
const { TelnyxWebhook } = require('telnyx/lib/webhooks');

function keyPair() {
  const { publicKey, privateKey } = crypto.generateKeyPairSync('ed25519');
  // The raw 32 bytes are the end of the SPKI DER encoding.
  const raw = publicKey.export({ type: 'spki', format: 'der' }).subarray(-32);
  return { publicKey: raw.toString('base64'), privateKey };
}

async function main() {
  const account = keyPair();
  const other = keyPair();
  const cases = JSON.parse(fs.readFileSync(0, 'utf8'));
  const verifier = new TelnyxWebhook(account.publicKey);
  const webhooks = [];
  for (const c of cases) {
    const timestamp = String(c.timestamp ?? Math.floor(Date.now() / 1000));
    const key = c.other_key ? other.privateKey : account.privateKey;
    const signature = crypto.sign(null, Buffer.from(timestamp + '|' + c.body, 'utf8'), key).toString('base64');
    let sdkVerified = true;
    try {
      await verifier.verify(c.send ?? c.body, {
        'telnyx-signature-ed25519': signature,
        'telnyx-timestamp': timestamp,
      });
    } catch (err) {
      sdkVerified = false;
    }
    webhooks.push({ signature, timestamp, sdk_verified: sdkVerified });
  }
  process.stdout.write(JSON.stringify({ public_key: account.publicKey, webhooks }));
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
