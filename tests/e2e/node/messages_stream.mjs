// Streams one message with the official TypeScript SDK (@anthropic-ai/sdk) and prints, as one JSON
// object, every raw stream event the SDK parsed and the SDK's own accumulated final message.
// Driven by tests/e2e/test_messages_clients.py; argv[2] is the request body as JSON.
// Environment: ANTHROPIC_BASE_URL (the gateway's root), ANTHROPIC_API_KEY.
import Anthropic from "@anthropic-ai/sdk";

const client = new Anthropic({ maxRetries: 0, timeout: 120_000 });
const stream = client.messages.stream(JSON.parse(process.argv[2]));
const events = [];
// A copy of each event as it arrives: the SDK builds its message snapshot in message_start's object.
stream.on("streamEvent", (event) => events.push(structuredClone(event)));
const final = await stream.finalMessage();
process.stdout.write(JSON.stringify({ events, final }));
