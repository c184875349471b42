// Drives Debian's Chromium through a real call and the latency dashboard (run by tests/test_browser.py).
//
//   node call_and_dashboard.mjs --base-url http://127.0.0.1:PORT --wav question.wav --out DIR [--chromium PATH]
//
// 1. Opens /dashboard first and waits for its live stream.
// 2. Opens / in a second tab, starts a call (the microphone is the wav file), and waits
//    until reply audio arrives: WebRTC's inbound-rtp stats show decoded energy, not silence.
//    While the caller speaks, the page shows their words so far (streaming partials).
// 3. Waits for the call to show as in progress, then for its turn to reach the open
//    dashboard live (a `turn` server-sent event, no reload), then hangs up.
// 4. Reloads the dashboard (stored turns from /api/turns) and reads the call's row again.
// Prints one JSON line with what it saw (also DIR/result.json); exits 1 with a reason on any
// failure or page error, leaving screenshots of the open pages in DIR.
import { parseArgs } from "node:util";
import { mkdirSync, writeFileSync } from "node:fs";
import path from "node:path";
import { chromium } from "playwright-core";

const { values: args } = parseArgs({
  options: {
    "base-url": { type: "string" }, wav: { type: "string" }, out: { type: "string" },
    chromium: { type: "string", default: "/usr/bin/chromium" },
  },
});
for (const required of ["base-url", "wav", "out"]) {
  if (!args[required]) { console.error(`missing --${required}`); process.exit(2); }
}

const CONNECT_TIMEOUT_MS = 20000;
const REPLY_TIMEOUT_MS = 45000;      // question (~4 s lead + 3 s speech) + ASR + LLM + TTS on 2 cores
const TURN_CLOSED_TIMEOUT_MS = 40000; // the reply plays out in real time (up to ~10 s) before the turn closes
// Energy (sum of audioLevel^2 x seconds) that silence never adds: speech at -20 dBFS adds ~0.01 per second.
const SPEECH_ENERGY = 0.001;

// Why each flag: headless Chromium as root on a closed network, a wav file as the microphone,
// and WebRTC between two peers on this machine's loopback.
const CHROMIUM_FLAGS = [
  "--headless", "--no-sandbox", "--disable-gpu",           // root in a container, no display, no GPU
  "--disable-background-networking", "--disable-component-update", "--no-first-run", "--disable-sync",
  "--disable-quic",                                         // nothing outside is reachable: don't try
  "--use-fake-ui-for-media-stream",                         // grant the microphone without a prompt
  "--use-fake-device-for-media-stream",                     // a fake capture device instead of hardware...
  `--use-file-for-fake-audio-capture=${args.wav}%noloop`,   // ...that plays this wav once, then silence
  "--allow-loopback-in-peer-connection",                    // gather 127.0.0.1 candidates (the server offers only those)
  "--disable-features=WebRtcHideLocalIpsWithMdns",          // real host addresses, not .local names aiortc can't resolve
  "--autoplay-policy=no-user-gesture-required",             // the reply's <audio autoplay> plays and is pulled through
];

const started = Date.now();
const timings = {};
const mark = (name) => { timings[name] = Date.now() - started; };
const pageErrors = [];
const openPages = {};  // name -> page, for screenshots when something fails

function watch(page, name) {
  openPages[name] = page;
  page.on("pageerror", (error) => pageErrors.push(`${name}: ${error.message}`));
  page.on("console", (message) => { if (message.type() === "error") pageErrors.push(`${name} console: ${message.text()}`); });
  page.on("response", (response) => { if (response.status() >= 400) pageErrors.push(`${name}: ${response.status()} for ${response.url()}`); });
}

async function waitForReplyAudio(page) {
  const deadline = Date.now() + REPLY_TIMEOUT_MS;
  let last = null;
  while (Date.now() < deadline) {
    last = await page.evaluate(() => window.cadenceCall.inboundAudio());
    if (last && last.totalAudioEnergy > SPEECH_ENERGY) return last;
    await page.waitForTimeout(100);
  }
  throw new Error(`no reply audio within ${REPLY_TIMEOUT_MS} ms; last inbound stats ${JSON.stringify(last)}`);
}

async function rowTtfs(page, callId, timeout) {
  const row = page.locator(`.wf-row[data-call-id="${callId}"][data-turn-index="0"]`);
  await row.waitFor({ timeout });
  await page.waitForFunction((id) => {
    const el = document.querySelector(`.wf-row[data-call-id="${id}"][data-turn-index="0"]`);
    return el && el.dataset.ttfsMs !== "";
  }, callId, { timeout });
  return { ttfs_ms: Number(await row.getAttribute("data-ttfs-ms")), text: (await row.innerText()).replace(/\s+/g, " ") };
}

async function main() {
  mkdirSync(args.out, { recursive: true });
  const browser = await chromium.launch({ executablePath: args.chromium, headless: true, args: CHROMIUM_FLAGS });
  mark("browser_launched");
  try {
    const context = await browser.newContext({ viewport: { width: 1280, height: 900 } });
    const dashboard = await context.newPage();
    watch(dashboard, "dashboard");
    await dashboard.goto(`${args["base-url"]}/dashboard`);
    await dashboard.locator('#live[data-state="live"]').waitFor({ timeout: 10000 });
    mark("dashboard_live");

    const call = await context.newPage();
    watch(call, "call page");
    await call.goto(`${args["base-url"]}/`);
    // Every partial the page shows, in order: the first may be Whisper's guess at half a word.
    await call.evaluate(() => {
      const partial = document.querySelector("#hearing .partial");
      window.partialsShown = [];
      new MutationObserver(() => {
        const text = partial.textContent;
        if (text && window.partialsShown.at(-1) !== text) window.partialsShown.push(text);
      }).observe(partial, { childList: true, characterData: true, subtree: true });
    });
    await call.click("#call");
    await call.locator('body[data-call-state="connected"]').waitFor({ timeout: CONNECT_TIMEOUT_MS });
    const callId = await call.evaluate(() => window.cadenceCall.callId);
    if (!callId) throw new Error("the call page has no call id after connecting");
    mark("call_connected");

    await dashboard.locator(`#calls tr[data-call-id="${callId}"]`).waitFor({ timeout: 5000 });
    mark("dashboard_shows_call_in_progress");

    // The caller's words so far, shown while they speak (the server streams partials).
    await call.locator("#hearing:not([hidden])").waitFor({ timeout: REPLY_TIMEOUT_MS });
    mark("partial_transcript_shown");

    const inbound = await waitForReplyAudio(call);
    mark("reply_audio_received");
    const hearing = await call.evaluate(() => window.partialsShown);

    // The turn closes when the reply has played out; the open dashboard gets it live.
    const live = await rowTtfs(dashboard, callId, TURN_CLOSED_TIMEOUT_MS);
    mark("dashboard_row_live");
    await call.locator("#turns li .ttfs").first().waitFor({ timeout: 5000 });
    const callShot = path.join(args.out, "call-page.png");
    await call.screenshot({ path: callShot, fullPage: true });

    await call.click("#hangup");
    await call.locator('body[data-call-state="ended"]').waitFor({ timeout: 5000 });
    await dashboard.locator(`#calls tr[data-call-id="${callId}"]`).waitFor({ state: "detached", timeout: 15000 });
    mark("call_ended_on_dashboard");

    await dashboard.reload();
    await dashboard.locator('#live[data-state="live"]').waitFor({ timeout: 10000 });
    const stored = await rowTtfs(dashboard, callId, 10000);
    await dashboard.waitForFunction(() => document.querySelector('#ttfs-overall [data-stat="p50"]').textContent !== "—",
                                    null, { timeout: 10000 });
    const p50 = await dashboard.locator('#ttfs-overall [data-stat="p50"]').textContent();
    const segments = await dashboard.locator(`.wf-row[data-call-id="${callId}"] .seg`).evaluateAll(
      (nodes) => nodes.map((n) => n.dataset.stage));
    mark("dashboard_row_after_reload");
    const dashboardShot = path.join(args.out, "dashboard.png");
    await dashboard.screenshot({ path: dashboardShot, fullPage: true });

    if (pageErrors.length) throw new Error(`page errors: ${pageErrors.join(" | ")}`);
    const result = JSON.stringify({
      call_id: callId, hearing, inbound_audio: inbound, live_row: live, stored_row: stored, dashboard_p50: p50,
      segments, screenshots: [callShot, dashboardShot], timings_ms: timings,
    });
    writeFileSync(path.join(args.out, "result.json"), result);
    console.log(result);
  } catch (error) {
    for (const [name, page] of Object.entries(openPages)) {
      const shot = path.join(args.out, `failed-${name.replace(/\W+/g, "-")}.png`);
      await page.screenshot({ path: shot, fullPage: true }).then(() => console.error(`screenshot: ${shot}`), () => {});
    }
    throw error;
  } finally {
    await browser.close();
  }
}

main().catch((error) => {
  console.error(`browser test failed after ${Date.now() - started} ms: ${error.message}`);
  if (pageErrors.length) console.error(`page errors: ${pageErrors.join(" | ")}`);
  console.error(`timings: ${JSON.stringify(timings)}`);
  process.exit(1);
});
