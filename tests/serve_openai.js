// build/serve driven by the official openai npm client (pinned by scripts/serve_ref.sh):
// a completion, a stream, 16 concurrent requests, cached tokens on a repeated prefix.
//   NODE_PATH=build/npm/node_modules node tests/serve_openai.js PORT
'use strict';
const OpenAI = require('openai');
const port = process.argv[2];
const client = new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey: 'none', maxRetries: 0 });
let failed = 0;
function check(cond, what) {
    console.log((cond ? 'ok: ' : 'FAIL: ') + what);
    if (!cond) failed++;
}

async function main() {
    const models = await client.models.list();
    const model = models.data[0].id;
    check(models.data.length === 1, `models.list: ${model}`);
    const c = await client.completions.create({ model, prompt: 'the cat ', max_tokens: 10, seed: 3 });
    check(c.object === 'text_completion' && c.usage.completion_tokens === 10 &&
          c.choices[0].text.length === 10 && c.choices[0].finish_reason === 'length',
          `a completion: ${JSON.stringify(c.choices[0].text)}`);
    const stream = await client.completions.create({ model, prompt: 'the cat ', max_tokens: 10, seed: 3,
                                                     stream: true });
    let text = '', n = 0, finish = null;
    for await (const ev of stream) {
        text += ev.choices[0].text;
        n++;
        if (ev.choices[0].finish_reason) finish = ev.choices[0].finish_reason;
    }
    check(n > 1 && text === c.choices[0].text && finish === 'length',
          `a stream: ${n} events, the completion's text`);
    const many = await Promise.all(Array.from({ length: 16 }, (_, i) =>
        client.completions.create({ model, prompt: `request ${i}: `, max_tokens: 8, seed: i })));
    check(many.every((r) => r.usage.completion_tokens === 8), '16 concurrent requests');
    const prefix = 'a shared system prompt that many requests start with, '.repeat(2);
    const a = await client.completions.create({ model, prompt: prefix + 'first', max_tokens: 4 });
    const b = await client.completions.create({ model, prompt: prefix + 'second', max_tokens: 4 });
    const cached = b.usage.prompt_tokens_details.cached_tokens;
    check(a.usage.prompt_tokens_details.cached_tokens === 0 && cached >= 96,
          `cached tokens on a repeated prefix: ${cached} of ${b.usage.prompt_tokens}`);
    try {
        await client.completions.create({ model, prompt: 'x', max_tokens: 1e9 });
        check(false, 'max_tokens 1e9 refused');
    } catch (e) {
        check(e.status === 400 && /maximum context length/.test(e.message), `max_tokens 1e9: ${e.status}`);
    }
    console.log(`${failed} failed`);
    process.exit(failed ? 1 : 0);
}
main().catch((e) => { console.log('FAIL:', e); process.exit(1); });
