// Drives the Responses API with the official OpenAI Node SDK (`openai`) and prints, as one JSON object, what the
// SDK handed back for each surface a coding agent uses: a stored response, its input-token count, a stream, a
// follow-up by previous_response_id, a background response polled to its end, one cancelled, a compaction and
// the request that continues from it, and a delete. Driven by tests/e2e/test_responses_agents.py; argv[2] is
// {"model": ...}. Environment: OPENAI_BASE_URL (the gateway's /v1), OPENAI_API_KEY.
import OpenAI from "openai";

const { model } = JSON.parse(process.argv[2]);
const client = new OpenAI({ maxRetries: 0, timeout: 120_000 });
const input = [
  { role: "user", content: "My name is Ada and I like tea." },
  { role: "assistant", content: "Nice to meet you, Ada." },
  { role: "user", content: "What do I like?" },
];
const short = { max_output_tokens: 8, temperature: 0 };
const out = {};

const plain = await client.responses.create({ model, input, store: true, ...short });
out.plain = { id: plain.id, object: plain.object, status: plain.status, text: plain.output_text, usage: plain.usage };

out.input_tokens = (await client.responses.inputTokens.count({ model, input })).input_tokens;

const events = [];
let streamed = null;
for await (const event of await client.responses.create({ model, input, stream: true, ...short })) {
  events.push(event.type);
  if (event.type === "response.completed" || event.type === "response.incomplete") streamed = event.response;
}
// (the SDK adds `output_text` to the responses it returns, not to the one inside a stream's final event)
const streamedText = (streamed?.output ?? []).flatMap((item) => item.content ?? [])
  .filter((part) => part.type === "output_text").map((part) => part.text).join("");
out.stream = { events, status: streamed?.status ?? null, text: streamedText };

const next = await client.responses.create({ model, previous_response_id: plain.id, input: "And my name?", ...short });
out.next = { status: next.status, previous_response_id: next.previous_response_id, usage: next.usage };

let bg = await client.responses.create({ model, input, background: true, ...short });
const first = bg.status;
for (let i = 0; i < 300 && (bg.status === "queued" || bg.status === "in_progress"); i++) {
  await new Promise((resolve) => setTimeout(resolve, 100));
  bg = await client.responses.retrieve(bg.id);
}
out.background = { first, status: bg.status, background: bg.background };

const long = await client.responses.create({ model, input, background: true, max_output_tokens: 2000 });
out.cancel = (await client.responses.cancel(long.id)).status;

// (a short summary: SmolLM2 would otherwise write up to the 2048 tokens a compaction may take)
const compacted = await client.responses.compact({ model, input, max_output_tokens: 48 });
out.compact = { object: compacted.object, types: compacted.output.map((item) => item.type) };
const after = await client.responses.create({
  model, input: [...compacted.output, { role: "user", content: "Go on." }], ...short });
out.after_compact = after.status;

await client.responses.delete(plain.id);
try {
  await client.responses.retrieve(plain.id);
  out.deleted = false;
} catch (err) {
  out.deleted = err.status === 404;
}
process.stdout.write(JSON.stringify(out));
