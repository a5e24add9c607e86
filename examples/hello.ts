// deno-lint-ignore-file no-import-prefix no-unversioned-import
/**
 * The first flow: count to 10, square each number on two replicas, join each number with its square,
 * and print the sums. Run it with `deno task vf validate examples/hello.ts` or `deno task vf compile ...`.
 */
import {
  ConsumerNode,
  END,
  Flow,
  ProcessorNode,
  ProducerNode,
  type RuntimeContext,
} from "jsr:@videoflow/cli";

/** Emits 1..n, then ends. */
export class Count extends ProducerNode<{ n: number }> {
  #i = 0;
  next(): number | typeof END {
    return this.#i < this.params.n ? ++this.#i : END;
  }
}

/** Squares its input. */
export class Square extends ProcessorNode {
  process(x: number): number {
    return x * x;
  }
}

/** Adds a number and its square: a join whose inputs arrive in `.from()` order. */
export class Sum extends ProcessorNode {
  process([a, b]: [number, number]): number {
    return a + b;
  }
}

/** Logs each value it receives. */
export class Print extends ConsumerNode {
  consume(x: number, ctx: RuntimeContext): void {
    ctx.logger.info(String(x));
  }
}

const count = new Count({ name: "count", n: 10 });
const square = new Square({ name: "square", nbTasks: 2 }).from(count);
const sum = new Sum({ name: "sum" }).from(count, square);
export default new Flow([new Print({ name: "print" }).from(sum)], { flowType: "batch", flowId: "squares" });
