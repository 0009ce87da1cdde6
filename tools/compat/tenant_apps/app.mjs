// A producer, a worker, or a refused tenant of BullMQ or Bull 4, on a Redis reached by a Unix
// socket, with its keys under <prefix> (BullMQ's and Bull's own `prefix` option: nothing else of
// the app changes between tenants).
//
//   node app.mjs <bullmq|bull> producer <socket> <prefix> <queue> <jobs>
//   node app.mjs <bullmq|bull> worker   <socket> <prefix> <queue> <jobs> [concurrency]
//   node app.mjs <bullmq|bull> refused  <socket> <prefix> <queue>
//   node app.mjs bullmq         features <socket> <prefix> <queue>
//
// The producer adds <jobs> jobs one by one; every fifth job's first attempt fails and is retried
// after a fixed backoff of BACKOFF_MS. The worker is started first; it records every attempt and,
// once every job has succeeded, prints one JSON line: the attempts per job, the retry gaps, the
// most handlers it saw at once, the queue's counts and (BullMQ) the `completed` events its
// QueueEvents read from the events stream. `refused` adds one job and runs a worker for a few
// seconds, and prints what each was told (a tenant with another tenant's prefix is refused).
import { createRequire } from 'node:module';

// The runner copies this file beside the node_modules it installed.
const require = createRequire(import.meta.url);
const BACKOFF_MS = 300;
const [lib, role, socket, prefix, name, jobsArg, concurrencyArg] = process.argv.slice(2);
const jobs = Number(jobsArg || 0);
const concurrency = Number(concurrencyArg || 4);
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
const fails = (i) => i % 5 === 0;
const jobOptions = (i) => ({
  jobId: `job-${i}`,
  attempts: 3,
  backoff: { type: 'fixed', delay: BACKOFF_MS },
});

// One interface over both libraries: add, process, counts, close.
function open(isWorker, handler, onCompleted, onError) {
  if (lib === 'bullmq') {
    const { Queue, Worker, QueueEvents } = require('bullmq');
    const connection = { path: socket };
    const queue = new Queue(name, { prefix, connection });
    queue.on('error', onError);
    let worker = null;
    let events = null;
    if (isWorker) {
      worker = new Worker(name, (job) => handler(job.id, job.attemptsMade, job.data),
        { prefix, connection, concurrency });
      worker.on('completed', onCompleted);
      worker.on('error', onError);
      events = new QueueEvents(name, { prefix, connection });
      events.on('error', onError);
    }
    return {
      ready: async () => {
        await queue.waitUntilReady();
        if (worker) await worker.waitUntilReady();
        if (events) await events.waitUntilReady();
      },
      add: (i, data) => queue.add('job', data, jobOptions(i)),
      events,
      counts: () => queue.getJobCounts('waiting', 'active', 'delayed', 'failed', 'completed',
        'prioritized', 'waiting-children'),
      close: async () => {
        if (worker) await worker.close();
        if (events) await events.close();
        await queue.close();
      },
    };
  }
  const Queue = require('bull');
  const queue = new Queue(name, { prefix, redis: { path: socket } });
  queue.on('error', onError);
  if (isWorker) {
    queue.on('completed', onCompleted);
    queue.process(concurrency, (job) => handler(job.id, job.attemptsMade, job.data));
  }
  return {
    ready: () => queue.isReady(),
    add: (i, data) => queue.add(data, jobOptions(i)),
    events: null,
    counts: () => queue.getJobCounts(),
    close: () => queue.close(),
  };
}

async function produce() {
  const started = Date.now();
  const queue = open(false, null, null, (error) => console.error(`queue error: ${error.message}`));
  await queue.ready();
  for (let i = 0; i < jobs; i++) await queue.add(i, { i, fail: fails(i) });
  await queue.close();
  console.log(JSON.stringify({ produced: jobs, ms: Date.now() - started }));
}

async function work() {
  const attempts = {}; // job id -> [{ attempt, start, end, ok }]
  let running = 0;
  let mostRunning = 0;
  let succeeded = 0;
  let firstStart = null;
  let done;
  const allDone = new Promise((resolve) => { done = resolve; });
  const errors = new Set();

  async function handle(id, attempt, data) {
    const start = Date.now();
    if (firstStart === null) firstStart = start;
    running += 1;
    mostRunning = Math.max(mostRunning, running);
    try {
      await sleep(5 + Math.floor(Math.random() * 20));
      if (data.fail && attempt === 0) throw new Error('the first attempt fails');
      return data.i;
    } finally {
      running -= 1;
      const ok = !(data.fail && attempt === 0);
      (attempts[id] = attempts[id] || []).push({ attempt, start, end: Date.now(), ok });
    }
  }
  function succeededOne() {
    succeeded += 1;
    if (succeeded === jobs) done();
  }
  const queue = open(true, handle, succeededOne, (error) => {
    errors.add(error.message);
    console.error(`${lib} error: ${error.message}`);
  });
  let eventsCompleted = 0;
  if (queue.events) queue.events.on('completed', () => { eventsCompleted += 1; });
  await queue.ready();
  console.error('worker ready');
  const timeout = sleep(Number(process.env.WORKER_TIMEOUT_MS || 120000)).then(() => 'timeout');
  const outcome = await Promise.race([allDone.then(() => 'done'), timeout]);
  const finished = Date.now();
  // What Redis holds once the last job is reported: nothing waiting, active or delayed; and the
  // last `completed` events read from the stream.
  for (let waited = 0; waited < 3000; waited += 100) {
    if (!queue.events || eventsCompleted >= jobs) break;
    await sleep(100);
  }
  await sleep(200);
  const counts = await queue.counts();
  await queue.close();

  const perJob = Object.values(attempts);
  const gaps = [];
  for (const list of perJob) {
    list.sort((a, b) => a.start - b.start);
    for (let k = 1; k < list.length; k++) gaps.push(list[k].start - list[k - 1].end);
  }
  const expected = (i) => (fails(i) ? 2 : 1);
  const wrong = [];
  for (let i = 0; i < jobs; i++) {
    const list = attempts[`job-${i}`] || [];
    const oks = list.filter((a) => a.ok).length;
    if (list.length !== expected(i) || oks !== 1) {
      wrong.push({ id: `job-${i}`, attempts: list.length, succeeded: oks });
    }
  }
  const stray = Object.keys(attempts)
    .filter((id) => !/^job-\d+$/.test(id) || Number(id.slice(4)) >= jobs);
  console.log(JSON.stringify({
    outcome,
    jobs,
    succeeded,
    attempts: perJob.reduce((n, list) => n + list.length, 0),
    wrong: wrong.slice(0, 10),
    wrongCount: wrong.length,
    stray,
    retries: gaps.length,
    retryGapMs: gaps.length ? { min: Math.min(...gaps), max: Math.max(...gaps) } : null,
    mostRunning,
    ms: firstStart === null ? null : finished - firstStart,
    counts,
    eventsCompleted: queue.events ? eventsCompleted : null,
    errors: [...errors].slice(0, 5),
  }));
  process.exit(0);
}

// BullMQ's other Lua paths, whose scripts build keys from their arguments (a child names its
// parent's key): a flow (a parent runs once its three children have, and reads their values), a
// delayed job (not run before its delay), a rate-limited worker (10 jobs at 4 a second take over
// 2 s), a job scheduler (a job every 300 ms, 3 of them), then `obliterate` of both queues.
async function features() {
  const { Queue, Worker, FlowProducer } = require('bullmq');
  const connection = { path: socket };
  const errors = new Set();
  const onError = (error) => errors.add(error.message);
  const queue = new Queue(name, { prefix, connection });
  const limitedName = `${name}-limited`;
  const limitedQueue = new Queue(limitedName, { prefix, connection });
  const flow = new FlowProducer({ prefix, connection });
  for (const emitter of [queue, limitedQueue, flow]) emitter.on('error', onError);
  const seen = { child: 0, parent: null, delayed: null, tick: [], limited: [] };
  const worker = new Worker(name, async (job) => {
    const { kind } = job.data;
    if (kind === 'child') { seen.child += 1; return job.data.n; }
    if (kind === 'parent') {
      const values = await job.getChildrenValues();
      seen.parent = {
        children: Object.keys(values).length,
        sum: Object.values(values).reduce((a, b) => a + b, 0),
        childrenBefore: seen.child,
      };
      return seen.parent.sum;
    }
    if (kind === 'delayed') { seen.delayed = Date.now() - job.data.at; return null; }
    if (job.name === 'tick') { seen.tick.push(Date.now()); return null; }
    return null;
  }, { prefix, connection, concurrency: 4 });
  const limited = new Worker(limitedName, async () => { seen.limited.push(Date.now()); },
    { prefix, connection, limiter: { max: 4, duration: 1000 } });
  for (const emitter of [worker, limited]) emitter.on('error', onError);
  await Promise.all([queue, limitedQueue, worker, limited].map((q) => q.waitUntilReady()));
  const started = Date.now();
  await flow.add({
    name: 'parent', queueName: name, data: { kind: 'parent' },
    children: [1, 2, 3]
      .map((n) => ({ name: 'child', queueName: name, data: { kind: 'child', n } })),
  });
  await queue.add('delayed', { kind: 'delayed', at: Date.now() }, { delay: 700 });
  for (let i = 0; i < 10; i++) await limitedQueue.add('limited', { i });
  await queue.upsertJobScheduler('ticker', { every: 300, limit: 3 }, { name: 'tick', data: {} });
  const deadline = Date.now() + 20000;
  while (Date.now() < deadline && !(seen.parent && seen.delayed !== null
    && seen.limited.length >= 10 && seen.tick.length >= 3)) await sleep(100);
  const ms = Date.now() - started;
  await queue.removeJobScheduler('ticker');
  await Promise.all([worker.close(), limited.close()]);
  const counts = await queue.getJobCounts('waiting', 'active', 'delayed', 'failed', 'completed',
    'waiting-children');
  let obliterated = 'ok';
  try {
    await queue.obliterate({ force: true });
    await limitedQueue.obliterate({ force: true });
  } catch (error) {
    obliterated = error.message;
  }
  await Promise.all([queue.close(), limitedQueue.close(), flow.close()]);
  const limitedSpan = seen.limited.length > 1
    ? seen.limited[seen.limited.length - 1] - seen.limited[0] : null;
  console.log(JSON.stringify({
    parent: seen.parent,
    children: seen.child,
    delayedAfterMs: seen.delayed,
    ticks: seen.tick.length,
    limited: seen.limited.length,
    limitedSpanMs: limitedSpan,
    counts,
    obliterated,
    ms,
    errors: [...errors].slice(0, 5),
  }));
  process.exit(0);
}

// Another tenant's prefix: adding a job and working the queue must both be refused.
async function refused() {
  const errors = new Set();
  // A refusal of a library's own background command (Bull's SUBSCRIBE of the queue's channels)
  // may reach no handler of the app: it is a refusal all the same.
  const uncaught = (error) => errors.add(`uncaught: ${error && error.message}`);
  process.on('uncaughtException', uncaught);
  process.on('unhandledRejection', uncaught);
  let processed = 0;
  const queue = open(true, async () => { processed += 1; }, () => {}, (error) => {
    errors.add(error.message);
  });
  let ready = 'ok';
  try {
    await Promise.race([queue.ready(),
      sleep(5000).then(() => { throw new Error('not ready in 5 s'); })]);
  } catch (error) {
    ready = error.message;
  }
  let add = 'added';
  try {
    await Promise.race([queue.add(0, { i: 0, fail: false }),
      sleep(5000).then(() => { throw new Error('add: no reply in 5 s'); })]);
  } catch (error) {
    add = error.message;
  }
  // The worker's loop: let it try a while.
  await sleep(3000);
  await Promise.race([queue.close().catch(() => {}), sleep(5000)]);
  console.log(JSON.stringify({ ready, add, workerErrors: [...errors].slice(0, 5), processed }));
  process.exit(0);
}

const roles = { producer: produce, worker: work, refused, features };
roles[role]().catch((error) => {
  console.error(error);
  process.exit(1);
});
