/**
 * The messenger stories through the embedded broker's clients: every backend and payload call crosses a
 * MessagePort to an EmbeddedBroker hosting the memory broker and payload store on the story's fake clock,
 * as a node worker of the local engine reaches them. The scenarios are the memory provider's, unchanged.
 *
 * @module
 */

import { messengerScenarios } from "./scenarios.ts";
import { embeddedProvider } from "./support.ts";

messengerScenarios(embeddedProvider());
