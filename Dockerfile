# The videoflow worker image: one node replica per pod, configured only by its VF_* environment
# (deno task deploy renders the manifests). Deno as .ci/run pins it, ffmpeg for the video nodes, and the
# project with its npm packages installed and every module cached at build time, so a pod fetches nothing
# when it starts. The NVIDIA driver's libnvidia-ml.so.1 comes from the node (the NVIDIA container toolkit).
#
#   docker build -t videoflow .
#   docker run --rm videoflow                                  # a worker: reads its VF_* environment
# (by hand, with every permission: a deployed pod's container runs the command vf deploy renders for it,
# with its node's declared permissions only; see src/deploy/manifests.ts).
#   docker run --rm --entrypoint deno videoflow task vf gpus   # vf itself, as on a host
ARG DENO_VERSION=2.9.6
FROM denoland/deno:debian-${DENO_VERSION}

RUN apt-get update \
  && apt-get install -y --no-install-recommends ffmpeg \
  && rm -rf /var/lib/apt/lists/*

WORKDIR /app
COPY deno.json deno.lock ./
COPY mod.ts ./
COPY src/ src/
COPY workers/ workers/
COPY ffi/ ffi/
COPY nvml/ nvml/
COPY tasks/ tasks/
COPY examples/ examples/
RUN deno install --frozen --entrypoint mod.ts workers/node_process.ts workers/node_worker.ts examples/*.ts \
  && chown -R deno:deno /app

USER deno
ENV DENO_NO_UPDATE_CHECK=1 VF_HEALTH_PORT=8080
EXPOSE 8080
ENTRYPOINT ["deno", "run", "-A", "--cached-only", "--v8-flags=--max-semi-space-size=8,--heap-growing-percent=50", "workers/node_process.ts"]
