// Signs and checks Twilio webhooks (status callbacks) with Twilio's own
// Node SDK, for the receiver's and the stub's tests: the X-Twilio-Signature
// Twilio sends (getExpectedTwilioSignature), and whether Twilio's
// validateRequest takes a request as Twilio's.
//
// Input (stdin): a JSON list of cases, each
//   {"op": "sign", "token", "url", "params"}: Twilio's signature of a
//     request to url (query string included) with the form params;
//   {"op": "validate", "token", "url", "params", "signature"}: whether the
//     SDK validates that request with that X-Twilio-Signature.
// params is an object of a form field's name to its values (a list, as Go's
// url.Values); a field given once is passed as a string, as a web
// framework's form parser gives it. Output (stdout): a JSON list of
// {"signature"} or {"valid"}, one per case.
'use strict';
const fs = require('node:fs');
const { getExpectedTwilioSignature, validateRequest } = require('twilio');

function formParams(values) {
  const out = {};
  for (const [name, vs] of Object.entries(values ?? {})) {
    out[name] = vs.length === 1 ? vs[0] : vs;
  }
  return out;
}

const cases = JSON.parse(fs.readFileSync(0, 'utf8'));
const out = cases.map((c) => {
  const params = formParams(c.params);
  switch (c.op) {
    case 'sign':
      return { signature: getExpectedTwilioSignature(c.token, c.url, params) };
    case 'validate':
      return { valid: validateRequest(c.token, c.signature, c.url, params) };
    default:
      throw new Error(`unknown op ${JSON.stringify(c.op)}`);
  }
});
process.stdout.write(JSON.stringify(out));
