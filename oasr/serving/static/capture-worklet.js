// Runs on the audio thread: hands the microphone's first channel to the page in blocks of BLOCK_FRAMES
// (the audio thread calls process() with 128 frames at a time; posting each would flood the page).
const BLOCK_FRAMES = 2048;

class CaptureProcessor extends AudioWorkletProcessor {
  constructor() {
    super();
    this.block = new Float32Array(BLOCK_FRAMES);
    this.filled = 0;
  }

  process(inputs) {
    const channel = inputs[0] && inputs[0][0];
    if (channel) {
      let start = 0;
      while (start < channel.length) {
        const taken = Math.min(channel.length - start, BLOCK_FRAMES - this.filled);
        this.block.set(channel.subarray(start, start + taken), this.filled);
        this.filled += taken;
        start += taken;
        if (this.filled === BLOCK_FRAMES) {
          this.port.postMessage(this.block);
          this.block = new Float32Array(BLOCK_FRAMES);
          this.filled = 0;
        }
      }
    }
    return true;  // keep running while the page holds the node
  }
}

registerProcessor("oasr-capture", CaptureProcessor);
