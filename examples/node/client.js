// A minimal Gödel client in JavaScript, generated at run time from the protos (the public
// contract): submit a job, read it back, watch its pods until each is placed, delete it.
//
//   cd examples/node && npm install
//   GODEL_ADDRESS=127.0.0.1:50051 GODEL_TLS_DIR=~/.godel/tls node client.js hello-node
//
// Credentials as the Python SDK finds them: GODEL_TLS_DIR (else $GODEL_HOME/tls, else
// ~/.godel/tls) holding ca.crt and the identity's certificate and key (GODEL_IDENTITY, default
// admin); GODEL_INSECURE=true for a cluster started with --insecure.
"use strict";

const fs = require("fs");
const os = require("os");
const path = require("path");
const grpc = require("@grpc/grpc-js");
const protoLoader = require("@grpc/proto-loader");

const ROOT = path.resolve(__dirname, "..", "..");
// Every service certificate carries this name; the server is checked against it (and the
// cluster CA) whatever address it was dialled at, as the Python SDK does.
const SERVICE_NAME = "godel-service";

function credentials() {
  if (["1", "true", "yes", "on"].includes((process.env.GODEL_INSECURE || "").toLowerCase())) {
    return { creds: grpc.credentials.createInsecure(), options: {} };
  }
  const home = process.env.GODEL_HOME || path.join(os.homedir(), ".godel");
  const dir = process.env.GODEL_TLS_DIR || path.join(home, "tls");
  const identity = process.env.GODEL_IDENTITY || "admin";
  const read = (name) => fs.readFileSync(path.join(dir, name));
  return {
    creds: grpc.credentials.createSsl(
      read("ca.crt"), read(`${identity}.key`), read(`${identity}.crt`)),
    options: { "grpc.ssl_target_name_override": SERVICE_NAME },
  };
}

function call(client, method, request) {
  return new Promise((resolve, reject) =>
    client[method](request, { deadline: Date.now() + 30_000 }, (error, reply) =>
      error ? reject(error) : resolve(reply)));
}

async function main() {
  const name = process.argv[2] || "hello-node";
  const address = process.env.GODEL_ADDRESS;
  if (!address) throw new Error("set GODEL_ADDRESS to the dispatcher's host:port");
  const definition = protoLoader.loadSync("protos/godel/v1/api.proto", {
    includeDirs: [ROOT], keepCase: true, longs: String, enums: String, defaults: true,
  });
  const godel = grpc.loadPackageDefinition(definition).godel.v1;
  const { creds, options } = credentials();
  const dispatcher = new godel.Dispatcher(address, creds, options);

  const job = {
    metadata: { name },
    spec: {
      replicas: 2, min_member: 2,
      template: { requests: { milli_cpu: "100", memory_bytes: String(64 << 20) } },
    },
  };
  const submitted = await call(dispatcher, "Submit", { request_id: `node-${name}`, jobs: [job] });
  const result = submitted.results[0];
  if (!result.created && !result.existing) {
    throw new Error(`refused: ${JSON.stringify(result.violations)}`);
  }
  console.log(`submitted job/${name}`);
  const stored = await call(dispatcher, "Get", { kind: "Job", name });
  console.log(`job/${name}: replicas ${stored.job.spec.replicas}, ` +
              `resource_version ${stored.job.metadata.resource_version}`);

  // Watch the job's pods (from the start: a listing, then changes) until every one is placed.
  const placed = new Map();
  await new Promise((resolve, reject) => {
    const stream = dispatcher.Watch({ kinds: ["Pod"], job: name });
    stream.on("data", (event) => {
      const pod = event.object && event.object.pod;
      if (!pod || !pod.spec.node_name || placed.has(pod.metadata.name)) return;
      placed.set(pod.metadata.name, pod.spec.node_name);
      console.log(`pod/${pod.metadata.name} on ${pod.spec.node_name}`);
      if (placed.size === job.spec.replicas) {
        stream.cancel();
        resolve();
      }
    });
    stream.on("error", (error) => (error.code === grpc.status.CANCELLED ? resolve() : reject(error)));
  });
  const deleted = await call(dispatcher, "Delete", { kind: "Job", name });
  console.log(`deleted job/${name} (${deleted.deleted} objects)`);
  dispatcher.close();
}

main().catch((error) => {
  console.error(`error: ${error.details || error.message}`);
  process.exit(1);
});
