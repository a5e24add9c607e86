/**
 * A parser for the proto3 subset `envelope.proto` is written in, so the wire schema loads without a
 * protobuf library: `syntax = "proto3";`, one `package`, `//` and `/* *\/` comments, top-level `enum`s
 * and `message`s, fields of the scalar types the codec implements or of a message or enum declared in the
 * file, `optional`, `repeated`, `map<string, V>` and `oneof`. Anything else (imports, options, nested
 * declarations, `reserved`, other scalar or key types, qualified type names, field options, proto2) is
 * refused with a `SyntaxError` that names the place and the construct, never skipped.
 *
 * The result is checked as protoc checks it: names unique in their scope, field numbers unique and in
 * protobuf's range (1 to 2^29 − 1, outside 19000–19999), enum values unique with the first one 0, and
 * every type reference resolved.
 *
 * @module
 */

/** The scalar types a field may have: the ones the wire codec reads and writes. */
export const PROTO_SCALARS = [
  "uint32",
  "uint64",
  "int64",
  "sint64",
  "double",
  "bool",
  "string",
  "bytes",
] as const;
/** A scalar type a field may have. */
export type ProtoScalar = typeof PROTO_SCALARS[number];

/** A field's type, resolved: a scalar, or a message or enum declared in the same file. */
export type ProtoType =
  | { readonly kind: "scalar"; readonly name: ProtoScalar }
  | { readonly kind: "message"; readonly name: string }
  | { readonly kind: "enum"; readonly name: string };

/**
 * How a field is labelled: `implicit` (proto3's plain singular field, absent at its default), `optional`
 * (explicit presence), `repeated`, or `map` (string keys; the field's type is the value type).
 */
export type ProtoLabel = "implicit" | "optional" | "repeated" | "map";

/** One field of a message, as declared. */
export interface ProtoField {
  /** The name as written (snake_case). */
  readonly name: string;
  /** The field number. */
  readonly number: number;
  /** The label; a oneof member is `implicit` and names its oneof. */
  readonly label: ProtoLabel;
  /** The field's type; a map's value type. */
  readonly type: ProtoType;
  /** The oneof the field belongs to, or `null`. */
  readonly oneof: string | null;
}

/** A oneof: its name and its members' names, in declaration order. */
export interface ProtoOneof {
  /** The oneof's name. */
  readonly name: string;
  /** The names of its fields, in declaration order. */
  readonly fields: readonly string[];
}

/** A message: its fields in declaration order, oneof members included, and its oneofs. */
export interface ProtoMessage {
  /** The message's short name (the package is {@link ProtoFile.package}). */
  readonly name: string;
  /** Every field, in declaration order. */
  readonly fields: readonly ProtoField[];
  /** Every oneof, in declaration order. */
  readonly oneofs: readonly ProtoOneof[];
}

/** One value of an enum. */
export interface ProtoEnumValue {
  /** The value's name as written. */
  readonly name: string;
  /** Its number. */
  readonly number: number;
}

/** An enum: its values in declaration order (the first is 0). */
export interface ProtoEnum {
  /** The enum's short name. */
  readonly name: string;
  /** Its values, in declaration order. */
  readonly values: readonly ProtoEnumValue[];
}

/** A parsed `.proto` file: its package and its top-level declarations, in declaration order. */
export interface ProtoFile {
  /** The `package` (`""` when the file declares none). */
  readonly package: string;
  /** The enums, in declaration order. */
  readonly enums: readonly ProtoEnum[];
  /** The messages, in declaration order. */
  readonly messages: readonly ProtoMessage[];
}

const SUBSET = "this parser reads the proto3 subset envelope.proto uses: syntax, package, comments, " +
  "top-level enum and message, scalar/message/enum fields, optional, repeated, map<string, V>, oneof";
const MAX_FIELD_NUMBER = 2 ** 29 - 1;
const INT32_MAX = 2 ** 31 - 1;

type TokenKind = "ident" | "int" | "string" | "symbol" | "end";

interface Token {
  readonly kind: TokenKind;
  readonly text: string;
  readonly line: number;
  readonly column: number;
}

const IDENT = "[A-Za-z_][A-Za-z0-9_]*";
/** Skipped text (blanks, comments), then one token per group: identifier (dots allowed), int, string, symbol. */
const TOKEN = new RegExp(
  [
    String.raw`\s+`,
    String.raw`\/\/[^\n]*`,
    String.raw`\/\*[\s\S]*?(?:\*\/|$)`,
    String.raw`(${IDENT}(?:\.${IDENT})*)`,
    String.raw`([0-9][A-Za-z0-9_]*)`,
    String.raw`("[^"\n\\]*"|'[^'\n\\]*')`,
    String.raw`([=;{}<>,\[])`,
  ].join("|"),
  "y",
);

/** The tokens of a file, read one ahead on demand, so an error is reported where the parse stops. */
class Tokens {
  #at = 0;
  #line = 1;
  #lineStart = 0;
  #current: Token;

  constructor(readonly text: string, readonly source: string) {
    this.#current = this.#scan();
  }

  #scan(): Token {
    while (this.#at < this.text.length) {
      const column = this.#at - this.#lineStart + 1;
      TOKEN.lastIndex = this.#at;
      const match = TOKEN.exec(this.text);
      if (match === null) {
        throw this.errorAt(this.#line, column, `unexpected character ${JSON.stringify(this.text[this.#at])}`);
      }
      if (match[0].startsWith("/*") && !match[0].endsWith("*/")) {
        throw this.errorAt(this.#line, column, "a /* comment is never closed");
      }
      const line = this.#line;
      for (let i = match[0].indexOf("\n"); i !== -1; i = match[0].indexOf("\n", i + 1)) {
        this.#line++;
        this.#lineStart = this.#at + i + 1;
      }
      this.#at += match[0].length;
      const kind: TokenKind | undefined = match[1] !== undefined
        ? "ident"
        : match[2] !== undefined
        ? "int"
        : match[3] !== undefined
        ? "string"
        : match[4] !== undefined
        ? "symbol"
        : undefined;
      if (kind !== undefined) return { kind, text: match[0], line, column };
    }
    return { kind: "end", text: "", line: this.#line, column: this.#at - this.#lineStart + 1 };
  }

  errorAt(line: number, column: number, message: string): SyntaxError {
    return new SyntaxError(`${this.source}:${line}:${column}: ${message}`);
  }

  error(token: Token, message: string): SyntaxError {
    return this.errorAt(token.line, token.column, message);
  }

  peek(): Token {
    return this.#current;
  }

  atEnd(): boolean {
    return this.#current.kind === "end";
  }

  take(): Token {
    const token = this.#current;
    if (!this.atEnd()) this.#current = this.#scan();
    return token;
  }

  /** Consumes `text` if it comes next. */
  accept(text: string): boolean {
    if (this.peek().text !== text) return false;
    this.take();
    return true;
  }

  expect(text: string, what = JSON.stringify(text)): Token {
    const token = this.peek();
    if (token.text !== text) throw this.unexpected(what);
    return this.take();
  }

  expectKind(kind: TokenKind, what: string): Token {
    if (this.peek().kind !== kind) throw this.unexpected(what);
    return this.take();
  }

  /** A plain (undotted) identifier. */
  name(what: string): Token {
    const token = this.expectKind("ident", what);
    if (token.text.includes(".")) {
      throw this.error(token, `${what} must be a plain name, found ${token.text}`);
    }
    return token;
  }

  unexpected(what: string): SyntaxError {
    const token = this.peek();
    const found = this.atEnd() ? "the end of the file" : JSON.stringify(token.text);
    return this.error(token, `expected ${what}, found ${found}`);
  }
}

interface DraftField {
  readonly token: Token;
  readonly name: string;
  readonly number: number;
  readonly label: ProtoLabel;
  readonly typeToken: Token;
  readonly oneof: string | null;
}

interface DraftMessage {
  readonly name: string;
  readonly fields: DraftField[];
  readonly oneofs: ProtoOneof[];
}

function unsupported(tokens: Tokens, token: Token, construct: string): SyntaxError {
  return tokens.error(token, `${construct} is not supported: ${SUBSET}`);
}

/** A decimal integer literal (protobuf's hex and octal forms are refused) and its value. */
function decimal(tokens: Tokens, what: string): [Token, number] {
  const token = tokens.expectKind("int", what);
  if (!/^(?:0|[1-9][0-9]*)$/.test(token.text)) {
    throw unsupported(tokens, token, `the number ${token.text} (only decimal numbers are read)`);
  }
  return [token, Number(token.text)];
}

function fieldNumber(tokens: Tokens): number {
  const [token, number] = decimal(tokens, "a field number");
  if (number < 1 || number > MAX_FIELD_NUMBER) {
    throw tokens.error(token, `field number ${token.text} is outside 1..${MAX_FIELD_NUMBER}`);
  }
  if (number >= 19000 && number <= 19999) {
    throw tokens.error(token, `field number ${number} is reserved for the protobuf implementation`);
  }
  return number;
}

function endOfField(tokens: Tokens): void {
  if (tokens.peek().text === "[") throw unsupported(tokens, tokens.peek(), "a field option");
  tokens.expect(";");
}

function parseField(tokens: Tokens, oneof: string | null): DraftField {
  const first = tokens.peek();
  let label: ProtoLabel = "implicit";
  let typeToken: Token;
  if (first.text === "map" && first.kind === "ident") {
    tokens.take();
    if (oneof !== null) throw tokens.error(first, "a map field cannot be a member of a oneof");
    tokens.expect("<");
    const key = tokens.expectKind("ident", "a map key type");
    if (key.text !== "string") throw unsupported(tokens, key, `a map key of type ${key.text}`);
    tokens.expect(",");
    typeToken = tokens.expectKind("ident", "a map value type");
    tokens.expect(">");
    label = "map";
  } else {
    if (first.text === "optional" || first.text === "repeated") {
      if (oneof !== null) throw tokens.error(first, `a oneof member cannot be ${first.text}`);
      label = first.text;
      tokens.take();
    } else if (first.text === "required" || first.text === "group") {
      throw unsupported(tokens, first, `"${first.text}" (proto2)`);
    }
    typeToken = tokens.expectKind("ident", "a field type");
  }
  const token = tokens.name("a field name");
  tokens.expect("=");
  const number = fieldNumber(tokens);
  endOfField(tokens);
  return { token, name: token.text, number, label, typeToken, oneof };
}

function parseOneof(tokens: Tokens, message: DraftMessage): void {
  const nameToken = tokens.name("a oneof name");
  const name = nameToken.text;
  if (message.oneofs.some((oneof) => oneof.name === name)) {
    throw tokens.error(nameToken, `${message.name} declares oneof ${name} twice`);
  }
  tokens.expect("{");
  const members: string[] = [];
  while (!tokens.accept("}")) {
    if (tokens.accept(";")) continue;
    const field = parseField(tokens, name);
    message.fields.push(field);
    members.push(field.name);
  }
  if (members.length === 0) throw tokens.error(tokens.peek(), `oneof ${name} has no fields`);
  message.oneofs.push({ name, fields: members });
}

const DECLARATIONS = new Set([
  "message",
  "enum",
  "service",
  "extend",
  "option",
  "reserved",
  "extensions",
  "import",
]);

function parseMessage(tokens: Tokens): DraftMessage {
  const message: DraftMessage = { name: tokens.name("a message name").text, fields: [], oneofs: [] };
  tokens.expect("{");
  while (!tokens.accept("}")) {
    const next = tokens.peek();
    if (tokens.accept(";")) continue;
    if (next.kind === "ident" && next.text === "oneof") {
      tokens.take();
      parseOneof(tokens, message);
    } else if (next.kind === "ident" && DECLARATIONS.has(next.text)) {
      throw unsupported(tokens, next, `"${next.text}" inside a message`);
    } else {
      message.fields.push(parseField(tokens, null));
    }
  }
  return message;
}

function parseEnum(tokens: Tokens): ProtoEnum {
  const name = tokens.name("an enum name").text;
  tokens.expect("{");
  const values: ProtoEnumValue[] = [];
  while (!tokens.accept("}")) {
    if (tokens.accept(";")) continue;
    const next = tokens.peek();
    if (next.text === "option" || next.text === "reserved") {
      throw unsupported(tokens, next, `"${next.text}" inside an enum`);
    }
    const value = tokens.name("an enum value name");
    tokens.expect("=");
    const [numberToken, number] = decimal(tokens, "a non-negative enum number");
    if (number > INT32_MAX) {
      throw tokens.error(numberToken, `enum number ${numberToken.text} is beyond int32`);
    }
    if (values.length === 0 && number !== 0) {
      throw tokens.error(numberToken, `the first value of proto3 enum ${name} must be 0`);
    }
    const clash = values.find((known) => known.name === value.text || known.number === number);
    if (clash !== undefined) {
      throw tokens.error(value, `${name}.${value.text} = ${number} repeats ${clash.name} = ${clash.number}`);
    }
    endOfField(tokens);
    values.push({ name: value.text, number });
  }
  if (values.length === 0) throw tokens.error(tokens.peek(), `enum ${name} has no values`);
  return { name, values };
}

function resolveType(
  tokens: Tokens,
  token: Token,
  messages: ReadonlySet<string>,
  enums: ReadonlySet<string>,
): ProtoType {
  const scalar = PROTO_SCALARS.find((name) => name === token.text);
  if (scalar !== undefined) return { kind: "scalar", name: scalar };
  if (token.text.includes(".")) throw unsupported(tokens, token, `the qualified type name ${token.text}`);
  if (messages.has(token.text)) return { kind: "message", name: token.text };
  if (enums.has(token.text)) return { kind: "enum", name: token.text };
  throw tokens.error(
    token,
    `unknown or unsupported type ${token.text}: a field is one of ${PROTO_SCALARS.join(", ")}, ` +
      "or a message or enum declared in this file",
  );
}

/**
 * A field's camelCase name (protoc's JSON name for the names this subset reads: each `_` followed by a
 * lower-case letter or digit dropped and that character upper-cased), the key under which the codec keeps
 * the field. Two fields of one message with the same camelCase name are refused, as protoc refuses them.
 */
export function camelCaseName(name: string): string {
  return name.replace(/_([a-z0-9])/g, (_, letter: string) => letter.toUpperCase());
}

function resolveMessage(
  tokens: Tokens,
  draft: DraftMessage,
  messages: ReadonlySet<string>,
  enums: ReadonlySet<string>,
): ProtoMessage {
  const fields: ProtoField[] = [];
  for (const field of draft.fields) {
    const clash = fields.find((known) => known.name === field.name || known.number === field.number);
    if (clash !== undefined) {
      throw tokens.error(
        field.token,
        `${draft.name}.${field.name} = ${field.number} repeats the name or number of ${clash.name} = ${clash.number}`,
      );
    }
    const sameCamelCase = fields.find((known) => camelCaseName(known.name) === camelCaseName(field.name));
    if (sameCamelCase !== undefined) {
      throw tokens.error(
        field.token,
        `${draft.name}.${field.name} has the camelCase name ${
          camelCaseName(field.name)
        } of ${sameCamelCase.name}`,
      );
    }
    if (draft.oneofs.some((oneof) => oneof.name === field.name)) {
      throw tokens.error(field.token, `${draft.name}.${field.name} has the name of a oneof`);
    }
    const type = resolveType(tokens, field.typeToken, messages, enums);
    fields.push({ name: field.name, number: field.number, label: field.label, type, oneof: field.oneof });
  }
  return { name: draft.name, fields, oneofs: draft.oneofs };
}

/**
 * The declarations of a proto3 file in the subset the module doc lists, every type reference resolved.
 * `source` names the file in error messages.
 *
 * @throws SyntaxError (with `source:line:column`) for text outside the subset, malformed text, or a file
 * protoc would refuse (a clash of names or numbers, an unknown type, a first enum value other than 0).
 */
export function parseProto(text: string, source = "<proto>"): ProtoFile {
  const tokens = new Tokens(text, source);
  tokens.expect("syntax", '"syntax" first');
  tokens.expect("=");
  const syntax = tokens.expectKind("string", 'the string "proto3"');
  if (syntax.text.slice(1, -1) !== "proto3") {
    throw unsupported(tokens, syntax, `syntax ${syntax.text}`);
  }
  tokens.expect(";");
  let pkg: string | null = null;
  const drafts: DraftMessage[] = [];
  const enums: ProtoEnum[] = [];
  const names = new Set<string>();
  while (!tokens.atEnd()) {
    const keyword = tokens.take();
    if (keyword.kind === "symbol" && keyword.text === ";") continue;
    if (keyword.kind === "ident" && keyword.text === "package") {
      if (pkg !== null) throw tokens.error(keyword, "a second package declaration");
      pkg = tokens.expectKind("ident", "a package name").text;
      tokens.expect(";");
      continue;
    }
    let name: string;
    if (keyword.kind === "ident" && keyword.text === "message") {
      const message = parseMessage(tokens);
      drafts.push(message);
      name = message.name;
    } else if (keyword.kind === "ident" && keyword.text === "enum") {
      const declared = parseEnum(tokens);
      enums.push(declared);
      name = declared.name;
    } else if (keyword.kind === "ident" && DECLARATIONS.has(keyword.text)) {
      throw unsupported(tokens, keyword, `"${keyword.text}"`);
    } else {
      throw tokens.error(
        keyword,
        `expected "package", "message" or "enum", found ${JSON.stringify(keyword.text)}`,
      );
    }
    if (names.has(name)) throw tokens.error(keyword, `${name} is declared twice`);
    names.add(name);
  }
  const messageNames = new Set(drafts.map((draft) => draft.name));
  const enumNames = new Set(enums.map((declared) => declared.name));
  return {
    package: pkg ?? "",
    enums,
    messages: drafts.map((draft) => resolveMessage(tokens, draft, messageNames, enumNames)),
  };
}
