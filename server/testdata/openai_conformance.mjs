// Conformance check of chunlian's OpenAI-compatible API with the official
// `openai` npm client. Run by TestOpenAINodeClient (server/openai_node_test.go)
// with BASE_URL, API_KEY and MODEL set; exits non-zero on the first failure.
import assert from "node:assert/strict";
import OpenAI from "openai";

const client = new OpenAI({ baseURL: process.env.BASE_URL + "/v1", apiKey: process.env.API_KEY, maxRetries: 0 });
const model = process.env.MODEL;
const couplet = (text) => assert.match(text, /^上联：\p{Script=Han}+\n下联：\p{Script=Han}+\n横批：\p{Script=Han}{4}$/u, text);

async function expectError(promise, status, cls, code, param) {
  try {
    const r = await promise;
    if (r && typeof r[Symbol.asyncIterator] === "function") for await (const _ of r) { /* drain */ }
  } catch (e) {
    assert.ok(e instanceof cls, `want ${cls.name}, got ${e.constructor.name}: ${e.message}`);
    assert.equal(e.status, status);
    assert.equal(e.code, code);
    assert.equal(e.param, param);
    assert.equal(typeof e.error.message, "string");
    return;
  }
  assert.fail(`no error (want ${status} ${code})`);
}

const models = await client.models.list();
assert.deepEqual(models.data.map((m) => m.id), [model]);
const m = await client.models.retrieve(model);
assert.equal(m.id, model);
await expectError(client.models.retrieve("gpt-4o"), 404, OpenAI.NotFoundError, "model_not_found", "model");

const c = await client.completions.create({ model, prompt: "平安", n: 2, seed: 1 });
assert.equal(c.object, "text_completion");
assert.equal(c.choices.length, 2);
c.choices.forEach((ch) => { couplet(ch.text); assert.equal(ch.finish_reason, "stop"); });
assert.ok(c.usage.total_tokens > 0);

const chat = await client.chat.completions.create({ model, messages: [{ role: "user", content: "请给我写一副关于平安的春联" }], seed: 2 });
assert.equal(chat.choices[0].message.role, "assistant");
couplet(chat.choices[0].message.content);

let text = "", tokens = 0, usage = null;
const stream = await client.chat.completions.create({ model, messages: [{ role: "user", content: "写一副藏头联，藏“吉祥”" }], stream: true, seed: 3 });
for await (const chunk of stream) {
  if (chunk.chunlian_token) tokens++;
  text += chunk.choices[0]?.delta?.content ?? "";
  if (chunk.usage) usage = chunk.usage;
}
couplet(text);
assert.ok(text.startsWith("上联：吉") && text.includes("下联：祥"), text);
assert.ok(tokens > 0, "no token chunks while generating");
assert.ok(usage && usage.completion_tokens > 0);

let ctext = "";
for await (const chunk of await client.completions.create({ model, prompt: "春回大地千山秀", stream: true })) ctext += chunk.choices[0]?.text ?? "";
couplet(ctext);

await expectError(client.completions.create({ model: "gpt-4o", prompt: "平安" }), 404, OpenAI.NotFoundError, "model_not_found", "model");
await expectError(client.completions.create({ model, prompt: "平安", stop: ["\n"] }), 400, OpenAI.BadRequestError, "unsupported_parameter", "stop");
await expectError(client.completions.create({ model, prompt: "平安", echo: true }), 400, OpenAI.BadRequestError, "unsupported_parameter", "echo");
await expectError(client.chat.completions.create({ model, messages: [{ role: "user", content: "平安" }], logprobs: true }), 400, OpenAI.BadRequestError, "unsupported_parameter", "logprobs");
await expectError(client.chat.completions.create({ model, messages: [{ role: "user", content: "平安" }], stream: true, length: 32 }), 400, OpenAI.BadRequestError, "bad_length", "length");
await expectError(client.chat.completions.create({ model, messages: [{ role: "user", content: "给我写一副春联" }] }), 400, OpenAI.BadRequestError, "invalid_prompt", "messages");
const bad = new OpenAI({ baseURL: process.env.BASE_URL + "/v1", apiKey: "wrong", maxRetries: 0 });
await expectError(bad.models.list(), 401, OpenAI.AuthenticationError, "unauthorized", null);
console.log("openai npm client: all checks passed");
