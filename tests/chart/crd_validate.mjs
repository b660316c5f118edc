// Validate custom resources against kubernetes-models' validators (scripts/get-crd-validators.sh).
//
//   node crd_validate.mjs DIR < manifests.json      # DIR: where the npm packages are installed
//
// stdin: a JSON list of manifests; stdout: a JSON list, one entry each:
// {"kind", "name", "errors": [...]} ("errors" is null for a kind with no validator here).
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { pathToFileURL } from "node:url";

const MODELS = {
  "keda.sh/v1alpha1/ScaledObject": "keda/keda.sh/v1alpha1/ScaledObject.js",
  "monitoring.coreos.com/v1/ServiceMonitor":
    "prometheus-operator/monitoring.coreos.com/v1/ServiceMonitor.js",
  "monitoring.coreos.com/v1/PodMonitor":
    "prometheus-operator/monitoring.coreos.com/v1/PodMonitor.js",
  "gateway.networking.k8s.io/v1/HTTPRoute": "gateway-api/gateway.networking.k8s.io/v1/HTTPRoute.js",
};

const dir = process.argv[2];
const docs = JSON.parse(readFileSync(0, "utf8"));
const out = [];
for (const doc of docs) {
  const key = `${doc.apiVersion}/${doc.kind}`;
  const entry = { kind: doc.kind, name: doc.metadata?.name ?? "", errors: null };
  if (key in MODELS) {
    const file = join(dir, "node_modules", "@kubernetes-models", MODELS[key]);
    const Model = (await import(pathToFileURL(file).href))[doc.kind];
    entry.errors = [];
    try {
      new Model(doc).validate();
    } catch (e) {
      entry.errors = String(e.message).split(", ");
    }
  }
  out.push(entry);
}
process.stdout.write(JSON.stringify(out));
