// A tidegate worker in JavaScript: the remote worker protocol over plain HTTP
// (docs/workers.md), with Node's own fetch and nothing to install (Node 18 or newer).
//
//   TIDEGATE_URL=http://localhost:8000 TIDEGATE_WORKER_TOKEN=tgw_... node examples/node-worker.mjs
//
// It has two tasks: "js.shout" returns its text in capitals, reporting progress per
// word (enqueued with {"text": ...}, or a webhook's body {"text": ...}); "js.fail" fails. One workloop, `manual>*:2` (TIDEGATE_WORKLOOPS to change it).
// SIGTERM stops claiming, lets running handlers finish, and hands back nothing: a run
// still running when it exits would be rescued after its lease.

const server = process.env.TIDEGATE_URL ?? "http://localhost:8000";
const token = process.env.TIDEGATE_WORKER_TOKEN;
const workloops = process.env.TIDEGATE_WORKLOOPS ?? "manual>*:2";

const tasks = {
  "js.shout": async (args, progress) => {
    const { text = "" } = args.body ?? args; // a webhook's run has its payload in "body"
    const words = text.split(" ");
    for (const [i, word] of words.entries()) {
      await progress({ word: i + 1, of: words.length });
    }
    return { shouted: text.toUpperCase(), by: "node" };
  },
  "js.fail": async () => {
    throw new Error("this task always fails");
  },
};

async function call(path, body) {
  const response = await fetch(server + path, {
    method: "POST",
    headers: { authorization: `Bearer ${token}`, "content-type": "application/json" },
    body: JSON.stringify(body),
  });
  const text = await response.text();
  if (!response.ok) throw new Error(`${path}: ${response.status} ${text}`);
  return text ? JSON.parse(text) : null;
}

let stopping = false;
process.on("SIGTERM", () => { stopping = true; });

const me = await call("/workers", { workloops, tasks: Object.keys(tasks), host: "node-example" });
const worker = `/workers/${encodeURIComponent(me.worker_id)}`;
const held = new Map(); // run id -> attempt
console.log(`registered ${me.worker_id}`);

// Heartbeats renew the leases of the runs it holds; "lost" runs were cancelled or rescued.
const beat = setInterval(async () => {
  try {
    await call(`${worker}/heartbeat`, { run_ids: [...held.keys()] });
  } catch (error) {
    console.error(`heartbeat failed: ${error.message}`);
  }
}, me.heartbeat_seconds * 1000);

async function execute(run) {
  const progress = (data) =>
    call(`${worker}/runs/${run.id}/progress`, { attempt: run.attempt, data });
  let outcome;
  try {
    const result = await tasks[run.task](run.args ?? {}, progress);
    outcome = { state: "succeeded", attempt: run.attempt, result: result ?? null };
  } catch (error) {
    outcome = { state: "failed", attempt: run.attempt, error: `Error: ${error.message}` };
  }
  try {
    await call(`${worker}/runs/${run.id}/outcome`, outcome);
  } catch (error) {
    console.error(`run ${run.id}: outcome not recorded: ${error.message}`);
  }
  held.delete(run.id);
}

// Each workloop claims for its free slots: a long poll, answered as soon as runs come.
async function workloop(index, slots) {
  const running = new Set();
  while (!stopping) {
    const free = slots - running.size;
    if (free === 0) {
      await Promise.race(running);
      continue;
    }
    let runs = [];
    try {
      ({ runs } = await call(`${worker}/claim`, { workloop: index, demand: free, wait_seconds: 5 }));
    } catch (error) {
      console.error(`claim failed: ${error.message}`);
      await new Promise((resolve) => setTimeout(resolve, 1000));
    }
    for (const run of runs) {
      held.set(run.id, run.attempt);
      const task = execute(run).finally(() => running.delete(task));
      running.add(task);
    }
  }
  await Promise.all(running);
}

await Promise.all(me.workloops.map((loop, index) => workloop(index, loop.slots)));
clearInterval(beat);
await call(`${worker}/stop`, { hand_back: [] });
console.log("stopped");
