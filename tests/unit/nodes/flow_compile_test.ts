import assert from "node:assert/strict";
import { compileToDict } from "../../../src/core/compiler.ts";
import { Flow } from "../../../src/core/flow.ts";
import { ModuleIndex, rebuildNode } from "../../../src/core/node_class.ts";
import * as frameWriter from "../../../src/nodes/frame_writer.ts";
import * as jsonlSink from "../../../src/nodes/jsonl_sink.ts";
import * as videoFileReader from "../../../src/nodes/video_file_reader.ts";

const url = (file: string) => new URL(`../../../src/nodes/${file}`, import.meta.url).href;
const MODULES = new ModuleIndex()
  .add(url("video_file_reader.ts"), videoFileReader)
  .add(url("frame_writer.ts"), frameWriter)
  .add(url("jsonl_sink.ts"), jsonlSink);

function flow(): Flow {
  const frames = new videoFileReader.VideoFileReader({ name: "frames", path: "clips/a.mp4", width: 640 });
  const out = new frameWriter.FrameWriter({ name: "out", path: "out/a.mkv", fps: 25, codec: "ffv1" }).from(
    frames,
  );
  const log = new jsonlSink.JsonlSink({ name: "log", path: "out/a.jsonl" }).from(frames);
  return new Flow([out, log], { flowId: "video" });
}

Deno.test("a flow of the built-in video nodes validates and compiles with their permissions and guarantees", () => {
  const built = flow();
  assert.deepEqual(built.validate(MODULES).filter((d) => d.severity === "error"), []);
  const document = compileToDict(built, { modules: MODULES });
  assert.deepEqual(document.permissions, {
    frames: { read: ["clips/a.mp4"], run: ["ffmpeg", "ffprobe"] },
    out: {
      read: ["out/a.mkv", "out/a.mkv.parts"],
      write: ["out/a.mkv", "out/a.mkv.parts"],
      run: ["ffmpeg", "ffprobe"],
    },
    log: { read: ["out/a.jsonl", "out/a.jsonl.keys"], write: ["out/a.jsonl", "out/a.jsonl.keys"] },
  });
  assert.deepEqual(document.sink_guarantees, { log: "idempotent_key" });
  const [frames] = document.specs;
  assert.equal(frames.node_class, `${url("video_file_reader.ts")}#VideoFileReader`);
  assert.deepEqual(frames.params, { name: "frames", path: "clips/a.mp4", width: 640 });
});

Deno.test("a worker rebuilds each node from its compiled spec with the same params and permissions", async () => {
  const built = flow();
  const { specs } = compileToDict(built, { modules: MODULES });
  for (const spec of specs) {
    const node = await rebuildNode(spec.node_class!, spec.params, spec.kind);
    const original = built.nodes.find((n) => n.name === spec.name)!;
    assert.equal(node.constructor, original.constructor);
    assert.deepEqual(node.getParams(), original.getParams());
    assert.deepEqual(node.permissions(), original.permissions());
  }
});
