// Calls the agent over WebRTC: microphone in, agent audio out, live transcript by polling
// /api/calls/{id}. ICE servers come from the page's origin config (none by default).
"use strict";

const callButton = document.getElementById("call");
const hangupButton = document.getElementById("hangup");
const statusLabel = document.getElementById("status");
const remoteAudio = document.getElementById("remote");
const turnList = document.getElementById("turns");
const hearing = document.getElementById("hearing");  // the caller's words so far, while they speak
const agentSelect = document.getElementById("agent");

const TRANSCRIPT_POLL_MS = 700;
let peer = null;
let microphone = null;
let pollTimer = null;

function setStatus(text) { statusLabel.textContent = text; }

// The call's phase and id, on <body data-call-state data-call-id> for styling, tests and
// debugging: idle -> connecting -> connected (media flowing) -> ended, or failed.
function setCallState(phase, callId) {
  document.body.dataset.callState = phase;
  if (callId !== undefined) document.body.dataset.callId = callId;
}

// What arrives from the agent, from WebRTC's own receive statistics: samples decoded and
// their energy (silence adds none), so a page or test can tell that a reply was heard.
async function inboundAudio() {
  if (!peer) return null;
  for (const report of (await peer.getStats()).values()) {
    if (report.type === "inbound-rtp" && report.kind === "audio") {
      return { totalSamplesReceived: report.totalSamplesReceived || 0, totalAudioEnergy: report.totalAudioEnergy || 0,
               audioLevel: report.audioLevel || 0 };
    }
  }
  return null;
}
window.cadenceCall = {
  get state() { return document.body.dataset.callState; },
  get callId() { return document.body.dataset.callId || null; },
  inboundAudio,
};
setCallState("idle");

function waitForIceGathering(pc) {
  if (pc.iceGatheringState === "complete") return Promise.resolve();
  return new Promise((resolve) => {
    const done = () => { if (pc.iceGatheringState === "complete") { pc.removeEventListener("icegatheringstatechange", done); resolve(); } };
    pc.addEventListener("icegatheringstatechange", done);
    setTimeout(resolve, 2000); // host candidates arrive in milliseconds; don't wait forever
  });
}

// A single-use client token for the offer (POST /v1/realtime/client_secrets, as OpenAI's).
// A server with API keys mints them only for its operator's backend, which hands one to this
// page in the URL's fragment (/#token=ek_...: a fragment never reaches a server or its logs);
// a server without keys (this machine only) mints one for the page itself.
async function clientToken() {
  const fromFragment = new URLSearchParams(location.hash.slice(1)).get("token");
  if (fromFragment) {
    history.replaceState(null, "", location.pathname + location.search);  // used once: forget it
    return fromFragment;
  }
  const response = await fetch("/v1/realtime/client_secrets", { method: "POST" });
  const minted = await response.json();
  if (!response.ok) throw new Error(minted.error || `server answered ${response.status}`);
  return minted.value;
}

async function startCall() {
  callButton.disabled = true;
  setCallState("connecting", "");
  setStatus("asking for the microphone…");
  try {
    microphone = await navigator.mediaDevices.getUserMedia({ audio: { echoCancellation: true, noiseSuppression: true } });
    peer = new RTCPeerConnection({ iceServers: [] });
    peer.addTransceiver(microphone.getAudioTracks()[0], { direction: "sendrecv" });
    // pipecat's SmallWebRTC clients open this channel for RTVI messages; the server queues
    // messages for it and warns when no client ever opens one.
    peer.createDataChannel("chat", { ordered: true });
    peer.ontrack = (event) => { remoteAudio.srcObject = event.streams[0] || new MediaStream([event.track]); };
    peer.onconnectionstatechange = () => {
      setStatus(peer ? peer.connectionState : "idle");
      if (peer && peer.connectionState === "connected") setCallState("connected");
      if (peer && ["failed", "closed", "disconnected"].includes(peer.connectionState)) hangUp();
    };
    await peer.setLocalDescription(await peer.createOffer());
    await waitForIceGathering(peer);
    const token = await clientToken();
    const response = await fetch("/api/offer", {
      method: "POST",
      headers: { "Content-Type": "application/json", "Authorization": `Bearer ${token}` },
      body: JSON.stringify({ sdp: peer.localDescription.sdp, type: peer.localDescription.type,
                             agent: agentSelect.value || undefined }),
    });
    const answer = await response.json();
    if (!response.ok) throw new Error(answer.error || `server answered ${response.status}`);
    await peer.setRemoteDescription({ sdp: answer.sdp, type: answer.type });
    hangupButton.disabled = false;
    setCallState(peer.connectionState === "connected" ? "connected" : "connecting", answer.call_id);
    setStatus("connected — say something");
    pollTranscript(answer.call_id);
  } catch (error) {
    setStatus(`could not call: ${error.message}`);
    hangUp();
    setCallState("failed");
  }
}

function pollTranscript(callId) {
  clearInterval(pollTimer);
  pollTimer = setInterval(async () => {
    try {
      const response = await fetch(`/api/calls/${encodeURIComponent(callId)}`);
      if (!response.ok) return;
      const call = await response.json();
      renderTurns(call.turns || []);
      renderHearing(call.hearing || "");
    } catch (_) { /* the next poll retries */ }
  }, TRANSCRIPT_POLL_MS);
}

function renderTurns(turns) {
  turnList.replaceChildren(...turns.map((turn) => {
    const item = document.createElement("li");
    const ttfs = turn.ttfs_ms == null ? "" : `<span class="ttfs">first audio ${Math.round(turn.ttfs_ms)} ms</span>`;
    item.innerHTML = `${ttfs}<div><span class="who">You</span><span class="user"></span></div>` +
      `<div><span class="who">Agent</span><span class="agent"></span>` +
      `${turn.interrupted ? ' <span class="interrupted">(interrupted)</span>' : ""}</div>`;
    item.querySelector(".user").textContent = turn.user_text;   // text, never HTML
    item.querySelector(".agent").textContent = turn.reply_text;
    return item;
  }));
}

// Streaming partials (when the server has asr.partial_every_s on): shown until the turn closes.
function renderHearing(text) {
  hearing.querySelector(".partial").textContent = text;  // text, never HTML
  hearing.hidden = !text;
}

function hangUp() {
  clearInterval(pollTimer);
  if (peer) { peer.close(); peer = null; }
  if (microphone) { microphone.getTracks().forEach((t) => t.stop()); microphone = null; }
  callButton.disabled = false;
  hangupButton.disabled = true;
  if (document.body.dataset.callState !== "idle") setCallState("ended");
}

// The agents this server offers; the default agent first. A page opened with ?agent=NAME
// preselects that one.
async function loadAgents() {
  try {
    const response = await fetch("/api/agents");
    const agents = response.ok ? (await response.json()).agents : [];
    const wanted = new URLSearchParams(location.search).get("agent");
    agentSelect.replaceChildren(...agents.map((agent) => {
      const option = document.createElement("option");
      option.value = agent.name;
      option.textContent = agent.name;
      option.selected = agent.name === wanted;
      return option;
    }));
  } catch (_) { /* the call still works with the server's default agent */ }
}
loadAgents();

callButton.addEventListener("click", startCall);
hangupButton.addEventListener("click", () => { hangUp(); setStatus("call ended"); });
