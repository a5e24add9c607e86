/**
 * The Kubernetes schema check of rendered objects: each object is constructed as its
 * `kubernetes-models` class (the API's OpenAPI schemas; KEDA's CRD schemas for a ScaledObject) and
 * validated. An object of a kind this module does not know is a failure, never a pass.
 *
 * @module
 */

import { ConfigMap, Service } from "kubernetes-models/v1";
import { Deployment, StatefulSet } from "kubernetes-models/apps/v1";
import { Job } from "kubernetes-models/batch/v1";
import { ScaledObject } from "@kubernetes-models/keda/keda.sh/v1alpha1";
import { ConfigError } from "../core/errors.ts";
import type { KubernetesObject } from "./manifests.ts";

/** A model class: constructed from an object's JSON, it checks the object against its schema. */
type ModelClass = new (data: never) => { validate(): void };

const MODELS: Readonly<Record<string, ModelClass>> = {
  "v1/ConfigMap": ConfigMap as unknown as ModelClass,
  "v1/Service": Service as unknown as ModelClass,
  "apps/v1/Deployment": Deployment as unknown as ModelClass,
  "apps/v1/StatefulSet": StatefulSet as unknown as ModelClass,
  "batch/v1/Job": Job as unknown as ModelClass,
  "keda.sh/v1alpha1/ScaledObject": ScaledObject as unknown as ModelClass,
};

/** Every `apiVersion/kind` this module validates. */
export const VALIDATED_KINDS: readonly string[] = Object.keys(MODELS);

/** What is wrong with `object` against its schema, or `null` when it validates. */
export function schemaProblem(object: KubernetesObject): string | null {
  const key = `${object.apiVersion}/${object.kind}`;
  const Model = MODELS[key];
  const name = `${object.kind} ${object.metadata?.name ?? "(unnamed)"}`;
  if (Model === undefined) return `${name}: no schema is known for ${key}`;
  try {
    new Model(structuredClone(object) as never).validate();
    return null;
  } catch (error) {
    return `${name}: ${error instanceof Error ? error.message : String(error)}`;
  }
}

/** Throws one {@link ConfigError} naming every object that does not validate against its schema. */
export function validateManifests(objects: readonly KubernetesObject[]): void {
  const problems = objects.map(schemaProblem).filter((p): p is string => p !== null);
  if (problems.length === 0) return;
  throw new ConfigError(
    `${problems.length} rendered object(s) do not validate against the Kubernetes schemas: ${
      problems.join("; ")
    }`,
    "this is a defect of the renderer: report it with the flow that shows it",
    { problems },
  );
}
