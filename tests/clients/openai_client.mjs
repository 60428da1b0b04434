// The official `openai` npm client (v6, pinned in package.json) against a kvinfer gateway:
// what a real client sees, not what our own parsers accept.
//   OPENAI_API_KEY=KEY node openai_client.mjs BASE_URL MODEL_ID CTX FORM
// FORM: embedded or disaggregated (both answer every check alike).
// BASE_URL: http://127.0.0.1:PORT/v1. Exits 0 when every check passes; prints each check.
import assert from 'node:assert/strict';
import OpenAI, { AuthenticationError, BadRequestError, NotFoundError } from 'openai';

const [baseURL, model, ctxArg, form] = process.argv.slice(2);
if (!baseURL || !model || !['embedded', 'disaggregated'].includes(form)) {
  console.error('usage: node openai_client.mjs BASE_URL MODEL_ID CTX embedded|disaggregated');
  process.exit(2);
}
const ctx = Number(ctxArg || 4096);
const apiKey = process.env.OPENAI_API_KEY;
if (!apiKey) {
  console.error('OPENAI_API_KEY: one of the gateway\'s keys (--api-keys)');
  process.exit(2);
}
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 60000 });
const messages = [{ role: 'user', content: 'Say something about caches.' }];
const greedy = { temperature: 0, max_tokens: 8 };

async function check(name, fn) {
  await fn();
  console.log(`ok   ${name}`);
}

async function refused(cls, fn, param, code) {
  let err;
  try {
    await fn();
  } catch (e) {
    err = e;
  }
  assert.ok(err instanceof cls, `expected ${cls.name}, got ${err}`);
  if (param) assert.equal(err.param, param);
  if (code) assert.equal(err.code, code);
  return err;
}

await check('a wrong API key is AuthenticationError', async () => {
  const stranger = new OpenAI({ baseURL, apiKey: 'not-a-key-of-this-gateway', maxRetries: 0 });
  await refused(AuthenticationError, () => stranger.models.list(), null, 'invalid_api_key');
});

await check('models.list lists the model', async () => {
  const ids = [];
  for await (const m of client.models.list()) ids.push(m.id);
  assert.ok(ids.includes(model), `${model} not in ${ids}`);
});

await check('models.retrieve', async () => {
  const m = await client.models.retrieve(model);
  assert.equal(m.id, model);
  assert.equal(m.object, 'model');
});

await check('models.retrieve of an unknown model is NotFoundError', async () => {
  await refused(NotFoundError, () => client.models.retrieve('no-such-model'), null,
    'model_not_found');
});

await check('completions.create', async () => {
  const r = await client.completions.create({ model, prompt: 'The cache', ...greedy });
  assert.equal(r.object, 'text_completion');
  assert.equal(r.model, model);
  assert.match(r.id, /^cmpl-[0-9a-f]{24}$/);
  assert.equal(typeof r.choices[0].text, 'string');
  assert.equal(r.usage.completion_tokens, 8);
  assert.equal(r.choices[0].finish_reason, 'length');
});

let answer;
await check('chat.completions.create', async () => {
  const r = await client.chat.completions.create({ model, messages, ...greedy });
  assert.equal(r.object, 'chat.completion');
  assert.match(r.id, /^chatcmpl-[0-9a-f]{24}$/);
  assert.equal(r.choices[0].message.role, 'assistant');
  answer = r.choices[0].message.content;
  assert.equal(typeof answer, 'string');
  assert.ok(answer.length > 0);
});

await check('chat stream: chunks add up to the same greedy answer', async () => {
  const s = await client.chat.completions.create({
    model, messages, ...greedy, stream: true, stream_options: { include_usage: true },
  });
  let text = '', usage;
  for await (const c of s) {
    if (c.choices.length) text += c.choices[0].delta.content ?? '';
    if (c.usage) usage = c.usage;
  }
  assert.equal(text, answer);
  assert.equal(usage.completion_tokens, 8);
});

await check('chat.completions.stream(...).finalChatCompletion()', async () => {
  const fin = await client.chat.completions.stream({ model, messages, ...greedy })
    .finalChatCompletion();
  assert.equal(fin.choices[0].message.role, 'assistant');
  assert.equal(fin.choices[0].message.content, answer);
});

await check('n = 2 streamed: finalChatCompletion() has both choices', async () => {
  const fin = await client.chat.completions.stream({ model, messages, ...greedy, n: 2 })
    .finalChatCompletion();
  assert.equal(fin.choices.length, 2);
  for (const c of fin.choices) {
    assert.equal(c.message.role, 'assistant');
    assert.equal(c.message.content, answer);
  }
});

await check('completion stream', async () => {
  const s = await client.completions.create({ model, prompt: 'The cache', ...greedy,
    stream: true });
  let n = 0;
  for await (const c of s) n += c.choices.length ? 1 : 0;
  assert.ok(n >= 2);
});

await check('an unknown model is NotFoundError (chat and completions)', async () => {
  await refused(NotFoundError,
    () => client.chat.completions.create({ model: 'gpt-4o', messages, ...greedy }), 'model',
    'model_not_found');
  await refused(NotFoundError,
    () => client.completions.create({ model: 'gpt-4o', prompt: 'x', ...greedy }), 'model',
    'model_not_found');
});

await check('an over-long request is BadRequestError context_length_exceeded', async () => {
  const e = await refused(BadRequestError,
    () => client.completions.create({ model, prompt: 'hello there', max_tokens: ctx - 1 }), null,
    'context_length_exceeded');
  assert.match(e.message, /context/);
});

await check('n = 2: two choices, each the greedy answer', async () => {
  const r = await client.chat.completions.create({ model, messages, ...greedy, n: 2 });
  assert.equal(r.choices.length, 2);
  assert.deepEqual(r.choices.map((c) => c.index), [0, 1]);
  for (const c of r.choices) assert.equal(c.message.content, answer);
  assert.equal(r.usage.completion_tokens, 16);
});

await check('logprobs (chat and completions, streamed, n = 2, token-id prompt)', async () => {
  const r = await client.chat.completions.create({ model, messages, ...greedy,
    logprobs: true, top_logprobs: 2 });
  const lp = r.choices[0].logprobs.content;
  assert.equal(lp.length, 8);
  assert.equal(lp.map((t) => t.token).join(''), r.choices[0].message.content);
  for (const t of lp) {
    assert.ok(t.logprob <= 0);
    assert.equal(t.top_logprobs.length, 2);
    assert.equal(t.top_logprobs[0].token, t.token); // greedy
  }
  const c = await client.completions.create({ model, prompt: 'The cache', ...greedy,
    logprobs: 1, n: 2 });
  assert.equal(c.choices.length, 2);
  for (const ch of c.choices) {
    assert.equal(ch.logprobs.tokens.length, 8);
    assert.equal(ch.logprobs.tokens.join(''), ch.text);
  }
  assert.deepEqual(c.choices[1].logprobs.token_logprobs, c.choices[0].logprobs.token_logprobs);
  const s = await client.chat.completions.create({ model, messages, ...greedy, logprobs: true,
    stream: true });
  let streamed = 0, text = '';
  for await (const chunk of s) {
    const ch = chunk.choices[0];
    if (!ch) continue;
    text += ch.delta?.content ?? '';
    streamed += ch.logprobs?.content?.length ?? 0;
  }
  assert.equal(streamed, 8);
  assert.equal(text, r.choices[0].message.content);
  const ids = await client.completions.create({ model, prompt: [11, 12, 13], ...greedy });
  assert.equal(ids.usage.prompt_tokens, 3);
  assert.equal(ids.usage.completion_tokens, 8);
});

await check('tools are refused, naming tools', async () => {
  await refused(BadRequestError, () => client.chat.completions.create({
    model, messages, ...greedy,
    tools: [{ type: 'function', function: { name: 'f', parameters: { type: 'object' } } }],
  }), 'tools');
});

console.log('all checks passed');
