// The page at /: live captions over /v1/realtime (OpenAI's GA Realtime transcription events) and file
// transcription over /v1/audio/transcriptions. Plain browser JavaScript, no build step, nothing from elsewhere.
"use strict";

const TARGET_RATE = 24000;  // the session's input: audio/pcm, 16-bit little-endian at 24 kHz
const APPEND_SAMPLES = TARGET_RATE / 10;  // 100 ms of audio per input_audio_buffer.append
const SCRIPT_PROCESSOR_FRAMES = 4096;  // the fallback capture node's block, for browsers without AudioWorklet
const STOP_GRACE_MS = 20000;  // after Stop, how long the last turn's transcript is waited for
const KEY_SUBPROTOCOL = "openai-insecure-api-key.";  // how a browser's WebSocket carries the API key
const TRANSCRIPT_PREFIX = "conversation.item.input_audio_transcription.";

// The session: 24 kHz PCM, turns cut by the server's VAD, in ``language`` when one is chosen.
function sessionUpdate(language) {
  const input = {format: {type: "audio/pcm", rate: TARGET_RATE}, turn_detection: {type: "server_vad"}};
  if (language) input.transcription = {language};
  return {type: "session.update", session: {type: "transcription", audio: {input}}};
}

// Converts a stream of blocks from the capture rate to TARGET_RATE. Downsampling averages the input over the
// span of each output sample (a box filter, which keeps most of what lies above the new Nyquist rate out);
// upsampling interpolates linearly. Samples not yet used carry over to the next block.
class StreamResampler {
  constructor(inputRate, outputRate) {
    this.step = inputRate / outputRate;  // input samples per output sample
    this.pending = new Float32Array(0);
    this.next = 0;  // position of the next output sample in ``pending``, in input samples
  }

  push(block) {
    const input = new Float32Array(this.pending.length + block.length);
    input.set(this.pending);
    input.set(block, this.pending.length);
    const output = new Float32Array(Math.ceil(input.length / this.step) + 1);
    let count = 0;
    if (this.step >= 1) {
      while (this.next + this.step <= input.length) {
        // Input sample i spans [i, i + 1): each counts by how much of it the output's span covers.
        const from = this.next;
        const to = from + this.step;
        let sum = 0;
        for (let i = Math.floor(from); i < Math.ceil(to); i++) {
          sum += input[i] * (Math.min(to, i + 1) - Math.max(from, i));
        }
        output[count++] = sum / this.step;
        this.next = to;
      }
    } else {
      while (this.next + 1 < input.length) {
        const i = Math.floor(this.next);
        const frac = this.next - i;
        output[count++] = input[i] * (1 - frac) + input[i + 1] * frac;
        this.next += this.step;
      }
    }
    const used = Math.min(Math.floor(this.next), input.length);
    this.pending = input.slice(used);
    this.next -= used;
    return output.subarray(0, count);
  }
}

// Float samples in [-1, 1] as base64 of 16-bit little-endian PCM.
function pcm16Base64(samples) {
  const bytes = new Uint8Array(samples.length * 2);
  const view = new DataView(bytes.buffer);
  for (let i = 0; i < samples.length; i++) {
    const clipped = Math.max(-1, Math.min(1, samples[i]));
    view.setInt16(2 * i, Math.round(clipped * 32767), true);
  }
  let binary = "";
  const chunk = 0x8000;  // String.fromCharCode takes its arguments on the stack: a bounded number at a time
  for (let i = 0; i < bytes.length; i += chunk) {
    binary += String.fromCharCode.apply(null, bytes.subarray(i, i + chunk));
  }
  return btoa(binary);
}

function authHeaders(key) {
  return key ? {Authorization: `Bearer ${key}`} : {};
}

// The message of an error response in OpenAI's shape, or its status line.
async function errorMessage(response) {
  try {
    const body = await response.json();
    if (body && body.error && body.error.message) return body.error.message;
  } catch (ignored) {
    // not JSON: the status line says enough
  }
  return `${response.status} ${response.statusText}`;
}

function showStatus(element, text, isError) {
  element.textContent = text;
  element.classList.toggle("error", Boolean(isError));
}

// One microphone session: the socket, the audio graph feeding it, and a caption line per item.
class LiveCaptions {
  constructor(elements, apiKey, choices) {
    this.elements = elements;
    this.apiKey = apiKey;
    this.choices = choices;
    this.lines = new Map();  // item_id -> {element, text, done}
    this.running = false;
    this.stopping = false;
    this.speaking = false;  // speech started and not yet committed
  }

  async start() {
    this.running = true;
    this.setButton(true);
    try {
      if (!navigator.mediaDevices || !navigator.mediaDevices.getUserMedia) {
        throw new Error("The browser gives the microphone to secure pages only: open this page over HTTPS, "
          + "or on this machine at localhost.");
      }
      this.status("Connecting…");
      this.socket = await this.open();
      this.status("Asking for the microphone…");
      this.stream = await navigator.mediaDevices.getUserMedia({
        // The server hears what the microphone hears: the page plays nothing to cancel, and the recogniser
        // copes with noise and level better than the browser's own filters leave it.
        audio: {channelCount: 1, echoCancellation: false, noiseSuppression: false, autoGainControl: false},
      });
      await this.startAudio();
      this.status("Listening: speak, and captions appear below.");
    } catch (error) {
      this.status(error.message || String(error), true);
      this.teardown();
    }
  }

  open() {
    const scheme = location.protocol === "https:" ? "wss:" : "ws:";
    const url = `${scheme}//${location.host}/v1/realtime?intent=transcription`;
    const key = this.apiKey();
    const protocols = key ? ["realtime", KEY_SUBPROTOCOL + key] : ["realtime"];
    return new Promise((resolve, reject) => {
      let socket;
      try {
        socket = new WebSocket(url, protocols);
      } catch (error) {
        reject(new Error("This API key cannot travel as a WebSocket subprotocol (it has characters none may hold)."));
        return;
      }
      socket.onopen = () => {
        socket.onclose = (event) => this.closed(event);
        socket.onmessage = (event) => this.handle(JSON.parse(event.data));
        socket.send(JSON.stringify(sessionUpdate(this.choices().language)));
        resolve(socket);
      };
      socket.onclose = () => this.refusal(key).then((message) => reject(new Error(message)));
    });
  }

  // A refused handshake tells the page nothing; the same key on an HTTP route says why.
  async refusal(key) {
    try {
      const response = await fetch("/v1/models", {headers: authHeaders(key)});
      if (!response.ok) return `The server refused the connection: ${await errorMessage(response)}`;
    } catch (ignored) {
      // the server is unreachable: said below
    }
    return "The server refused the realtime connection or could not be reached.";
  }

  async startAudio() {
    this.context = new AudioContext();
    this.resampler = new StreamResampler(this.context.sampleRate, TARGET_RATE);
    this.unsent = [];
    this.numUnsent = 0;
    const source = this.context.createMediaStreamSource(this.stream);
    const silent = this.context.createGain();  // the graph must reach the output to be pulled; heard as silence
    silent.gain.value = 0;
    silent.connect(this.context.destination);
    if (this.context.audioWorklet && typeof AudioWorkletNode === "function") {
      await this.context.audioWorklet.addModule("/static/capture-worklet.js");
      this.node = new AudioWorkletNode(this.context, "oasr-capture");
      this.node.port.onmessage = (event) => this.capture(event.data);
    } else {
      this.node = this.context.createScriptProcessor(SCRIPT_PROCESSOR_FRAMES, 1, 1);
      this.node.onaudioprocess = (event) => this.capture(new Float32Array(event.inputBuffer.getChannelData(0)));
    }
    source.connect(this.node);
    this.node.connect(silent);
    await this.context.resume();
  }

  capture(block) {
    const samples = this.resampler.push(block);
    this.unsent.push(samples);
    this.numUnsent += samples.length;
    if (this.numUnsent >= APPEND_SAMPLES) this.flush();
  }

  flush() {
    if (!this.numUnsent || !this.socket || this.socket.readyState !== WebSocket.OPEN) return;
    const joined = new Float32Array(this.numUnsent);
    let offset = 0;
    for (const part of this.unsent) {
      joined.set(part, offset);
      offset += part.length;
    }
    this.unsent = [];
    this.numUnsent = 0;
    this.socket.send(JSON.stringify({type: "input_audio_buffer.append", audio: pcm16Base64(joined)}));
  }

  handle(event) {
    const type = event.type;
    if (type === "input_audio_buffer.speech_started") {
      this.speaking = true;
      this.line(event.item_id);
    } else if (type === "input_audio_buffer.committed") {
      this.speaking = false;
      this.line(event.item_id);
    } else if (type === TRANSCRIPT_PREFIX + "delta") {
      const line = this.line(event.item_id);
      this.render(line, line.text + event.delta, "partial");
    } else if (type === TRANSCRIPT_PREFIX + "segment") {
      // A server with a diarization model says who spoke each part of the item, just before it completes.
      this.line(event.item_id).segments.push(event);
    } else if (type === TRANSCRIPT_PREFIX + "completed") {
      const line = this.line(event.item_id);
      line.done = true;
      this.render(line, event.transcript, "final");
      this.showSpeakers(line);
    } else if (type === TRANSCRIPT_PREFIX + "failed") {
      const line = this.line(event.item_id);
      line.done = true;
      this.render(line, `(not transcribed: ${event.error ? event.error.message : "unknown error"})`, "failed");
    } else if (type === "error") {
      const error = event.error || {};
      if (!(this.stopping && error.code === "input_audio_buffer_commit_empty")) {
        this.status(`Server: ${error.message || "error"}`, true);
      }
    }
    if (this.stopping) this.closeWhenDone();
  }

  line(itemId) {
    let line = this.lines.get(itemId);
    if (!line) {
      const element = document.createElement("li");
      element.dataset.itemId = itemId;
      this.elements.captions.append(element);
      line = {element, text: "", done: false, segments: []};
      this.lines.set(itemId, line);
      this.render(line, "", "partial");
    }
    return line;
  }

  render(line, text, state) {
    line.text = text;
    line.element.className = state;
    line.element.textContent = text.trim() || "…";
    this.elements.copy.disabled = ![...this.lines.values()].some((each) => each.text.trim());
  }

  // The final line as its speakers' parts, each led by its speaker ("Speaker A"); the text itself is unchanged.
  showSpeakers(line) {
    if (!line.segments.length) return;
    line.element.textContent = "";
    line.segments.forEach((segment, i) => {
      const part = document.createElement("span");
      part.className = "turn";
      part.dataset.speaker = segment.speaker;
      const who = document.createElement("span");
      who.className = "speaker";
      who.textContent = `Speaker ${segment.speaker}: `;
      part.append(who, document.createTextNode(segment.text));
      if (i) line.element.append("\n");  // copied captions keep one speaker's part per line
      line.element.append(part);
    });
    line.element.dataset.speakers = String(line.segments.length);
  }

  // Stop: the microphone closes at once; a turn still open is committed, and the socket waits for the
  // transcripts still to come.
  stop() {
    this.stopAudio();
    this.flush();
    this.stopping = true;
    if (!this.socket || this.socket.readyState !== WebSocket.OPEN) {
      this.teardown();
      return;
    }
    this.status("Finishing the last caption…");
    if (this.speaking) this.socket.send(JSON.stringify({type: "input_audio_buffer.commit"}));
    this.graceTimer = setTimeout(() => this.teardown(), STOP_GRACE_MS);
    this.closeWhenDone();
  }

  closeWhenDone() {
    const waiting = this.speaking || [...this.lines.values()].some((line) => !line.done);
    if (!waiting) this.teardown();
  }

  closed(event) {
    if (!this.stopping) {
      const reason = event.reason ? `: ${event.reason}` : "";
      this.status(`The connection closed (code ${event.code})${reason}.`, true);
    }
    this.teardown();
  }

  stopAudio() {
    if (this.stream) this.stream.getTracks().forEach((track) => track.stop());
    if (this.node) this.node.disconnect();
    if (this.context && this.context.state !== "closed") this.context.close();
    this.stream = this.node = this.context = null;
  }

  teardown() {
    clearTimeout(this.graceTimer);
    this.stopAudio();
    if (this.socket && this.socket.readyState <= WebSocket.OPEN) {
      this.socket.onclose = null;
      this.socket.close(1000);
    }
    this.socket = null;
    if (this.stopping && !this.elements.status.classList.contains("error")) this.status("Microphone off.");
    this.running = false;
    this.setButton(false);
  }

  setButton(on) {
    this.elements.mic.setAttribute("aria-pressed", String(on));
    this.elements.mic.textContent = on ? "Stop microphone" : "Start microphone";
  }

  status(text, isError) {
    showStatus(this.elements.status, text, isError);
  }
}

// A file sent to /v1/audio/transcriptions: its text shown, and its subtitles downloaded on request.
class FileTranscriber {
  constructor(elements, apiKey, choices) {
    this.elements = elements;
    this.apiKey = apiKey;
    this.choices = choices;
    this.file = null;
  }

  async transcribe(file) {
    this.file = file;
    this.setDownloads(false);
    this.elements.transcript.textContent = "";
    showStatus(this.elements.status, `Transcribing ${file.name}…`);
    try {
      const response = await this.post("json");
      if (!response.ok) throw new Error(await errorMessage(response));
      this.elements.transcript.textContent = (await response.json()).text.trim();
      showStatus(this.elements.status, `Transcript of ${file.name}:`);
      this.setDownloads(true);
    } catch (error) {
      showStatus(this.elements.status, `Could not transcribe ${file.name}: ${error.message}`, true);
    }
  }

  async download(format) {
    if (!this.file) return;
    try {
      const response = await this.post(format);
      if (!response.ok) throw new Error(await errorMessage(response));
      const link = document.createElement("a");
      link.href = URL.createObjectURL(await response.blob());
      link.download = `${this.file.name.replace(/\.[^.]*$/, "") || "transcript"}.${format}`;
      document.body.append(link);
      link.click();
      link.remove();
      setTimeout(() => URL.revokeObjectURL(link.href), 60000);
    } catch (error) {
      showStatus(this.elements.status, `Could not make the ${format.toUpperCase()} file: ${error.message}`, true);
    }
  }

  async post(format) {
    const {language, translate} = this.choices();
    const form = new FormData();
    form.append("file", this.file, this.file.name);
    form.append("model", await this.model());
    form.append("response_format", format);
    if (language) form.append("language", language);
    const route = translate ? "/v1/audio/translations" : "/v1/audio/transcriptions";
    return fetch(route, {method: "POST", body: form, headers: authHeaders(this.apiKey())});
  }

  // The served model's name; OpenAI's default name (an alias the server accepts) when it cannot be read.
  async model() {
    try {
      const response = await fetch("/v1/models", {headers: authHeaders(this.apiKey())});
      if (response.ok) return (await response.json()).data[0].id;
    } catch (ignored) {
      // the transcription request says what is wrong
    }
    return "whisper-1";
  }

  setDownloads(enabled) {
    this.elements.srt.disabled = !enabled;
    this.elements.vtt.disabled = !enabled;
    this.elements.copy.disabled = !enabled;
  }
}

// Text onto the clipboard; the button says it worked (or why not) for a moment.
async function copyText(button, text) {
  const label = button.textContent;
  try {
    await navigator.clipboard.writeText(text);
    button.textContent = "Copied";
  } catch (error) {
    button.textContent = "Copy failed: select the text instead";
  }
  setTimeout(() => { button.textContent = label; }, 1500);
}

// The model this server serves and what it offers (GET /page/config, open like the page): shown at the top,
// and the language and translation choices filled in where the model has them.
async function showModel(byId) {
  let config;
  try {
    const response = await fetch("/page/config");
    if (!response.ok) throw new Error(await errorMessage(response));
    config = await response.json();
  } catch (error) {
    showStatus(byId("model"), `Could not ask the server which model it serves: ${error.message}`, true);
    return;
  }
  const model = byId("model");
  model.textContent = "Talking to ";
  const name = document.createElement("strong");
  name.textContent = config.model;
  model.append(name, config.streaming ? ", a streaming model: captions grow as you speak." : ".");
  const select = byId("language");
  for (const {code, name: languageName} of config.languages) {
    select.append(new Option(`${languageName} (${code})`, code));
  }
  byId("language-choice").hidden = config.languages.length === 0;
  byId("translate-choice").hidden = !config.translate;
  byId("choices").hidden = config.languages.length === 0 && !config.translate;
}

function main() {
  const byId = (id) => document.getElementById(id);
  const apiKey = () => byId("api-key").value.trim();
  const choices = () => ({language: byId("language").value, translate: byId("translate").checked});
  showModel(byId);
  let live = null;
  byId("mic").addEventListener("click", () => {
    if (live && live.running) {
      live.stop();
    } else {
      live = new LiveCaptions({mic: byId("mic"), status: byId("live-status"), captions: byId("captions"),
                               copy: byId("copy-captions")}, apiKey, choices);
      live.start();
    }
  });

  const files = new FileTranscriber({
    status: byId("file-status"), transcript: byId("transcript"), srt: byId("download-srt"), vtt: byId("download-vtt"),
    copy: byId("copy-transcript"),
  }, apiKey, choices);
  byId("copy-transcript").addEventListener("click", (event) => copyText(event.target, byId("transcript").textContent));
  byId("copy-captions").addEventListener("click", (event) => copyText(event.target,
    [...document.querySelectorAll("#captions li.final")].map((li) => li.textContent).join("\n")));
  const input = byId("file");
  input.addEventListener("change", () => input.files.length && files.transcribe(input.files[0]));
  byId("download-srt").addEventListener("click", () => files.download("srt"));
  byId("download-vtt").addEventListener("click", () => files.download("vtt"));

  const drop = byId("drop");
  // A file dropped beside the zone would otherwise be opened by the browser, leaving the page.
  for (const name of ["dragover", "drop"]) document.addEventListener(name, (event) => event.preventDefault());
  drop.addEventListener("dragover", () => drop.classList.add("over"));
  drop.addEventListener("dragleave", () => drop.classList.remove("over"));
  drop.addEventListener("drop", (event) => {
    drop.classList.remove("over");
    if (event.dataTransfer.files.length) files.transcribe(event.dataTransfer.files[0]);
  });
}

main();
