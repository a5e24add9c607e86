import assert from "node:assert/strict";
import { libraryCandidates, openSharedLibrary } from "../../../ffi/shared_library.ts";

const search = {
  overrideVariable: "TEST_LIBRARY",
  candidates: ["/nonexistent/liba.so.1", "libc.so.6", "libm.so.6"],
};

Deno.test("the override variable, when set, is the one place tried; else the candidates in order", () => {
  assert.deepEqual(libraryCandidates(search, () => "/opt/lib/x.so"), ["/opt/lib/x.so"]);
  assert.deepEqual(libraryCandidates(search, () => undefined), search.candidates);
  assert.deepEqual(libraryCandidates(search, () => ""), search.candidates, "an empty override is unset");
});

Deno.test("the first candidate that loads is the library; one that does not is skipped", () => {
  const opened = openSharedLibrary(search, () => undefined);
  assert.equal(opened.kind, "known");
  assert.equal(opened.kind === "known" && opened.value.path, "libc.so.6");
});

Deno.test("nothing loadable is Unknown naming every place tried and the loader's reason", () => {
  const opened = openSharedLibrary(search, () => "/nonexistent/override.so");
  assert.equal(opened.kind, "unknown");
  if (opened.kind !== "unknown") return;
  assert.equal(opened.reason, "missing");
  assert.match(opened.detail, /^no shared library could be loaded \(\/nonexistent\/override\.so: .+\)$/);
  assert.doesNotMatch(opened.detail, /libc/, "the candidates are not tried behind an override");
});
