import assert from "node:assert/strict";
import { SchemaError } from "../../../src/core/errors.ts";
import { Tensor, tensorProblem, WireDouble, wireMap } from "../../../src/wire/value.ts";

Deno.test("a tensor whose shape, dtype and data disagree cannot be built", () => {
  const refused: Array<[readonly number[], string, number, string]> = [
    [[2, 3], "float32", 20, "holds 24 bytes, its data has 20"],
    [[-1], "uint8", 0, "not a size: -1"],
    [[1.5], "uint8", 1, "not a size: 1.5"],
    [[2 ** 53], "uint8", 0, "not a size"],
    [[1], "", 1, "needs a dtype"],
  ];
  for (const [shape, dtype, length, message] of refused) {
    assert.ok(tensorProblem(shape, dtype, length)?.includes(message), message);
    assert.throws(() => new Tensor(shape, dtype, new Uint8Array(length)), SchemaError);
  }
  assert.equal(tensorProblem([], "float64", 8), null);
  assert.equal(tensorProblem([0, 5], "int64", 0), null);
  assert.equal(tensorProblem([3], "datetime64[ns]", 5), null, "a dtype of unknown size is carried as is");
});

Deno.test("Tensor.from takes the dtype of the typed array and shares its memory", () => {
  const source = new Float32Array([1, 2, 3, 4, 5, 6]);
  const tensor = Tensor.from(source, [2, 3]);
  assert.equal(tensor.dtype, "float32");
  assert.deepEqual(tensor.shape, [2, 3]);
  source[0] = 42;
  assert.equal((tensor.view() as Float32Array)[0], 42);
  assert.equal(Tensor.from(new BigInt64Array(2)).dtype, "int64");
  assert.equal(Tensor.from(new Uint8ClampedArray(2)).dtype, "uint8");
  assert.deepEqual(Tensor.from(new Int16Array(4)).shape, [4]);
});

Deno.test("view() reads every dtype with a typed array, without a copy when the data is aligned", () => {
  const views: Array<[string, new (length: number) => ArrayBufferView & ArrayLike<unknown>]> = [
    ["uint8", Uint8Array],
    ["int8", Int8Array],
    ["uint16", Uint16Array],
    ["int16", Int16Array],
    ["float16", Float16Array],
    ["uint32", Uint32Array],
    ["int32", Int32Array],
    ["float32", Float32Array],
    ["uint64", BigUint64Array],
    ["int64", BigInt64Array],
    ["float64", Float64Array],
    ["bool", Uint8Array],
  ];
  for (const [dtype, View] of views) {
    const source = new View(3);
    const tensor = new Tensor([3], dtype, new Uint8Array(source.buffer));
    const view = tensor.view();
    assert.equal(view.constructor, View, dtype);
    assert.equal(view.length, 3, dtype);
    assert.equal(view.buffer, source.buffer, `${dtype} is a view, not a copy`);
  }
});

Deno.test("view() copies data that is not aligned to the element size, keeping the values", () => {
  const backing = new Uint8Array(9);
  new DataView(backing.buffer).setFloat64(1, 2.5, true);
  const tensor = new Tensor([1], "float64", backing.subarray(1));
  const view = tensor.view() as Float64Array;
  assert.notEqual(view.buffer, backing.buffer);
  assert.deepEqual([...view], [2.5]);
});

Deno.test("view() of a dtype without a typed array says to read the raw bytes", () => {
  assert.throws(() => new Tensor([1], "complex64", new Uint8Array(8)).view(), (error: unknown) => {
    assert.ok(error instanceof SchemaError);
    assert.match(error.remedy!, /tensor\.data/);
    return true;
  });
});

Deno.test("a WireDouble behaves as its number in arithmetic, comparison and JSON", () => {
  const two = new WireDouble(2);
  assert.equal(+two + 1, 3);
  assert.ok(two > new WireDouble(1.5));
  assert.equal(JSON.stringify({ two }), '{"two":2}');
});

Deno.test("wireMap keeps entry order, makes __proto__ an own key and lets a later duplicate win", () => {
  const map = wireMap([["b", 1], ["__proto__", "own"], ["a", 2], ["b", 3]]);
  assert.deepEqual(Object.keys(map), ["b", "__proto__", "a"]);
  assert.equal(Object.getPrototypeOf(map), Object.prototype);
  assert.equal(Object.getOwnPropertyDescriptor(map, "__proto__")?.value, "own");
  assert.equal(map.b, 3);
});
