// Validate the chart's custom resources against their CRDs' schemas, as the npm
// packages @kubernetes-models/prometheus-operator and @kubernetes-models/keda generate
// them (`get.sh crd-models` brings them).
//
//   node check-custom-resources.mjs MODELS_DIR < objects.json
//
// stdin: a JSON array of rendered objects. One line per object, "ok KIND/NAME" or
// "invalid KIND/NAME: why"; exit status 1 if any is invalid or of a kind not listed.
import { readFileSync } from "node:fs";

const models = process.argv[2];
const classes = {
  "monitoring.coreos.com/v1 ServiceMonitor": ["prometheus-operator/monitoring.coreos.com/v1/ServiceMonitor.js", "ServiceMonitor"],
  "monitoring.coreos.com/v1 PrometheusRule": ["prometheus-operator/monitoring.coreos.com/v1/PrometheusRule.js", "PrometheusRule"],
  "keda.sh/v1alpha1 ScaledObject": ["keda/keda.sh/v1alpha1/ScaledObject.js", "ScaledObject"],
  "keda.sh/v1alpha1 TriggerAuthentication": ["keda/keda.sh/v1alpha1/TriggerAuthentication.js", "TriggerAuthentication"],
};

let failed = false;
for (const object of JSON.parse(readFileSync(0, "utf8"))) {
  const what = `${object.kind}/${object.metadata?.name}`;
  const entry = classes[`${object.apiVersion} ${object.kind}`];
  if (!entry) {
    console.log(`invalid ${what}: no schema for ${object.apiVersion} ${object.kind}`);
    failed = true;
    continue;
  }
  const module = await import(`${models}/${entry[0]}`);
  try {
    new module[entry[1]](object).validate();
    console.log(`ok ${what}`);
  } catch (e) {
    console.log(`invalid ${what}: ${e.message}`);
    failed = true;
  }
}
process.exit(failed ? 1 : 0);
