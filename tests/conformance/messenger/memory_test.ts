/**
 * The messenger stories over the memory reference broker and payload store, on a fake clock, with a memory
 * run ledger or (where a story needs durability) a file ledger in a temporary directory.
 *
 * @module
 */

import { messengerScenarios } from "./scenarios.ts";
import { memoryProvider } from "./support.ts";

messengerScenarios(memoryProvider);
