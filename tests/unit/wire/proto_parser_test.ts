import assert from "node:assert/strict";
import { parseProto } from "../../../src/wire/proto_parser.ts";

const HEADER = 'syntax = "proto3";\npackage demo.v1;\n';

function assertRefused(body: string, contains: string, where?: string): void {
  assert.throws(() => parseProto(HEADER + body, "demo.proto"), (error: unknown) => {
    assert.ok(error instanceof SyntaxError, String(error));
    assert.ok(error.message.includes(contains), error.message);
    if (where !== undefined) assert.ok(error.message.startsWith(`demo.proto:${where}: `), error.message);
    return true;
  });
}

Deno.test("the subset parses: comments, enums, messages, labels, maps, oneofs, references in any order", () => {
  const file = parseProto(
    `// leading comment
    syntax = 'proto3'; /* block
    comment */ package demo.v1;;
    message Outer {
      Inner inner = 2; // a message declared later
      optional double when = 1;
      repeated sint64 dims = 3;
      map<string, Inner> named = 4;
      Kind kind = 5;
      oneof choice { string text = 6; bytes blob = 7; ; }
      uint32 a = 536870911;
    }
    enum Kind { KIND_UNSPECIFIED = 0; KIND_A = 2; }
    message Inner {}`,
  );
  assert.deepEqual(file, {
    package: "demo.v1",
    enums: [{
      name: "Kind",
      values: [{ name: "KIND_UNSPECIFIED", number: 0 }, { name: "KIND_A", number: 2 }],
    }],
    messages: [
      {
        name: "Outer",
        fields: [
          {
            name: "inner",
            number: 2,
            label: "implicit",
            type: { kind: "message", name: "Inner" },
            oneof: null,
          },
          {
            name: "when",
            number: 1,
            label: "optional",
            type: { kind: "scalar", name: "double" },
            oneof: null,
          },
          {
            name: "dims",
            number: 3,
            label: "repeated",
            type: { kind: "scalar", name: "sint64" },
            oneof: null,
          },
          { name: "named", number: 4, label: "map", type: { kind: "message", name: "Inner" }, oneof: null },
          { name: "kind", number: 5, label: "implicit", type: { kind: "enum", name: "Kind" }, oneof: null },
          {
            name: "text",
            number: 6,
            label: "implicit",
            type: { kind: "scalar", name: "string" },
            oneof: "choice",
          },
          {
            name: "blob",
            number: 7,
            label: "implicit",
            type: { kind: "scalar", name: "bytes" },
            oneof: "choice",
          },
          {
            name: "a",
            number: 536870911,
            label: "implicit",
            type: { kind: "scalar", name: "uint32" },
            oneof: null,
          },
        ],
        oneofs: [{ name: "choice", fields: ["text", "blob"] }],
      },
      { name: "Inner", fields: [], oneofs: [] },
    ],
  });
});

Deno.test("a file without a package has the empty package", () => {
  assert.deepEqual(parseProto('syntax = "proto3"; message M { bool b = 1; }').package, "");
});

Deno.test("constructs outside the subset are refused by name, with the file, line and column", () => {
  assertRefused('import "other.proto";', '"import" is not supported', "3:1");
  assertRefused('option java_package = "x";', '"option" is not supported');
  assertRefused("service S {}", '"service" is not supported');
  assertRefused("message M { message N {} }", '"message" inside a message is not supported', "3:13");
  assertRefused("message M { enum E { A = 0; } }", '"enum" inside a message is not supported');
  assertRefused("message M { reserved 2; }", '"reserved" inside a message is not supported');
  assertRefused("message M { option deprecated = true; }", '"option" inside a message is not supported');
  assertRefused("message M { int32 x = 1; }", "unknown or unsupported type int32");
  assertRefused("message M { float x = 1; }", "unknown or unsupported type float");
  assertRefused("message M { map<int32, string> x = 1; }", "a map key of type int32 is not supported");
  assertRefused("message M { demo.v1.M x = 1; }", "the qualified type name demo.v1.M is not supported");
  assertRefused("message M { string x = 1 [deprecated = true]; }", "a field option is not supported");
  assertRefused("message M { required string x = 1; }", '"required" (proto2) is not supported');
  assertRefused("enum E { A = 0; option allow_alias = true; }", '"option" inside an enum is not supported');
  assertRefused("enum E { A = -1; }", 'unexpected character "-"');
  assertRefused(
    "message M { string x = 0x1; }",
    "the number 0x1 (only decimal numbers are read) is not supported",
  );
  assertRefused("enum E { A = 00; }", "the number 00 (only decimal numbers are read)");
  assertRefused('message M { string x = "1"; }', "expected a field number");
  assertRefused("/* never closed", "a /* comment is never closed", "3:1");
  assertRefused("message M { string x = 1; ", "expected a field type, found the end of the file");
  assertRefused("message M.N {}", "a message name must be a plain name");
  assert.throws(() => parseProto('syntax = "proto2";'), /syntax "proto2" is not supported/);
  assert.throws(() => parseProto("package p;"), /expected "syntax" first, found "package"/);
});

Deno.test("what protoc refuses is refused: clashes, ranges, unknown types, enum rules, empty oneofs", () => {
  assertRefused("message M { string x = 1; bool x = 2; }", "M.x = 2 repeats the name or number of x = 1");
  assertRefused("message M { string x = 1; bool y = 1; }", "M.y = 1 repeats the name or number of x = 1");
  assertRefused("message M { oneof o { string x = 1; } bool y = 1; }", "repeats the name or number");
  assertRefused("message M { oneof x { string y = 1; } bool x = 2; }", "M.x has the name of a oneof");
  assertRefused(
    "message M { string foo_bar = 1; bool fooBar = 2; }",
    "M.fooBar has the camelCase name fooBar of foo_bar",
  );
  assertRefused("message M { string a_1 = 1; oneof o { bytes a1 = 2; } }", "camelCase name a1 of a_1");
  assertRefused("message M { oneof o { string x = 1; } oneof o { bool y = 2; } }", "declares oneof o twice");
  assertRefused("message M { oneof o { } }", "oneof o has no fields");
  assertRefused("message M { oneof o { repeated string x = 1; } }", "a oneof member cannot be repeated");
  assertRefused("message M { oneof o { optional string x = 1; } }", "a oneof member cannot be optional");
  assertRefused(
    "message M { oneof o { map<string, string> x = 1; } }",
    "a map field cannot be a member of a oneof",
  );
  assertRefused("message M { string x = 0; }", "field number 0 is outside 1..536870911");
  assertRefused("message M { string x = 536870912; }", "field number 536870912 is outside");
  assertRefused("message M { string x = 19000; }", "field number 19000 is reserved");
  assertRefused("message M { string x = 19999; }", "field number 19999 is reserved");
  assertRefused("message M { Missing x = 1; }", "unknown or unsupported type Missing");
  assertRefused("enum E { A = 1; }", "the first value of proto3 enum E must be 0");
  assertRefused("enum E { A = 0; B = 0; }", "E.B = 0 repeats A = 0");
  assertRefused("enum E { A = 0; A = 1; }", "E.A = 1 repeats A = 0");
  assertRefused("enum E { A = 0; B = 2147483648; }", "enum number 2147483648 is beyond int32");
  assertRefused("enum E { }", "enum E has no values");
  assertRefused("message M {} enum M { A = 0; }", "M is declared twice");
  assertRefused("package other;", "a second package declaration");
  assertRefused("M {}", 'expected "package", "message" or "enum", found "M"');
});
