// Sends one message through Twilio's Node SDK with a validity period, and
// one batch through Sinch's (@sinch/sdk-core) with an expiry, each to a
// server of the test's, so that the provider adapters' tests can compare
// the parameter the official SDK sends, its name and its encoding, with
// the adapter's. The SDKs' own HTTP clients and encoders do the work; only
// the host is the test's.
//
// Input (stdin): {"base": "http://127.0.0.1:<port>",
//   "twilio": {"account_sid", "auth_token", "to", "from", "body", "validity_period": <seconds>},
//   "sinch": {"service_plan_id", "api_token", "to", "from", "body", "expire_at": "<ISO 8601>"}}.
// Output (stdout): {"twilio": "<message sid>", "sinch": "<batch id>"}.
'use strict';
const fs = require('node:fs');
const twilio = require('twilio');
const { SinchClient } = require('@sinch/sdk-core');

async function main() {
  const input = JSON.parse(fs.readFileSync(0, 'utf8'));
  const base = new URL(input.base);

  // Twilio's SDK has no base URL setting: its own request client is
  // given every request, with the host swapped for the test's.
  const real = new twilio.RequestClient();
  const httpClient = {
    request(opts) {
      const uri = new URL(opts.uri);
      uri.protocol = base.protocol;
      uri.host = base.host;
      return real.request({ ...opts, uri: uri.href });
    },
  };
  const tw = input.twilio;
  const client = twilio(tw.account_sid, tw.auth_token, { httpClient });
  const message = await client.messages.create({
    to: tw.to, from: tw.from, body: tw.body, validityPeriod: tw.validity_period,
  });

  const si = input.sinch;
  const sinch = new SinchClient({
    servicePlanId: si.service_plan_id, apiToken: si.api_token, smsHostname: base.origin,
  });
  const batch = await sinch.sms.batches.send({
    sendSMSRequestBody: { to: [si.to], from: si.from, body: si.body, expire_at: new Date(si.expire_at) },
  });

  process.stdout.write(JSON.stringify({ twilio: message.sid, sinch: batch.id }));
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
