// A producer or a worker of Bull 4 or bee-queue, on a Redis reached by a Unix socket.
//
//   node app.js <bull|bee> <producer|worker> <socket> <queue> <jobs> [concurrency]
//
// The producer adds <jobs> jobs one by one; every fifth job's first attempt fails and is retried
// after a fixed backoff of BACKOFF_MS. The worker is started first, so its <concurrency> loops all
// wait in BRPOPLPUSH on one connection before any job exists. It records every attempt, and once
// every job has succeeded prints one JSON line: the attempts per job, the retry gaps, the most
// handlers it saw running at once and the queue's counts (`active` must be 0).
'use strict';

const BACKOFF_MS = 300;
const [lib, role, socket, name, jobsArg, concurrencyArg] = process.argv.slice(2);
const jobs = Number(jobsArg);
const concurrency = Number(concurrencyArg || 4);
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
const fails = (i) => i % 5 === 0;

function bullQueue() {
  const Queue = require('bull');
  return new Queue(name, { redis: { path: socket } });
}

function beeQueue(isWorker) {
  const Queue = require('bee-queue');
  return new Queue(name, {
    redis: { path: socket },
    isWorker,
    activateDelayedJobs: isWorker,
    removeOnSuccess: false,
  });
}

async function produce() {
  const started = Date.now();
  if (lib === 'bull') {
    const queue = bullQueue();
    for (let i = 0; i < jobs; i++) {
      await queue.add({ i, fail: fails(i) }, {
        jobId: `job-${i}`,
        attempts: 3,
        backoff: { type: 'fixed', delay: BACKOFF_MS },
      });
    }
    await queue.close();
  } else {
    const queue = beeQueue(false);
    await queue.ready();
    for (let i = 0; i < jobs; i++) {
      await queue.createJob({ i, fail: fails(i) }).setId(`job-${i}`)
        .retries(2).backoff('fixed', BACKOFF_MS).save();
    }
    await queue.close();
  }
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

  let queue;
  if (lib === 'bull') {
    queue = bullQueue();
    queue.on('completed', succeededOne);
    queue.on('error', (error) => console.error(`bull error: ${error.message}`));
    queue.process(concurrency, (job) => handle(job.id, job.attemptsMade, job.data));
    await queue.isReady();
  } else {
    queue = beeQueue(true);
    queue.on('succeeded', succeededOne);
    queue.on('error', (error) => console.error(`bee-queue error: ${error.message}`));
    queue.process(concurrency, (job) => handle(job.id, 2 - job.options.retries, job.data));
    await queue.ready();
  }
  console.error('worker ready');
  const timeout = sleep(Number(process.env.WORKER_TIMEOUT_MS || 120000)).then(() => 'timeout');
  const outcome = await Promise.race([allDone.then(() => 'done'), timeout]);
  const finished = Date.now();
  // What Redis holds once the last job is reported: nothing waiting, active or delayed.
  await sleep(200);
  const counts = lib === 'bull' ? await queue.getJobCounts() : await queue.checkHealth();
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
    if (list.length !== expected(i) || oks !== 1) wrong.push({ id: `job-${i}`, attempts: list.length, succeeded: oks });
  }
  const stray = Object.keys(attempts).filter((id) => !/^job-\d+$/.test(id) || Number(id.slice(4)) >= jobs);
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
  }));
  process.exit(0);
}

(role === 'producer' ? produce() : work()).catch((error) => {
  console.error(error);
  process.exit(1);
});
