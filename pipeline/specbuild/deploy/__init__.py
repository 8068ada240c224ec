"""`specbuild deploy`: a Helm chart that runs the pair on a Kubernetes cluster (docs/kubernetes.md).

The chart's templates are static files shipped here (`chart/`); what comes from the spec is rendered into
`values.yaml` (every value a user changes, the spec's figures as defaults), `values.schema.json` and `Chart.yaml`:
- `deploy.facts`: the facts the chart takes from where they already live (serve's options and exit timeout, the
  supervisor's metrics file, the build's manifests, the multi-node launcher, the Triton image, the GPUs);
- `deploy.values`: values.yaml and its schema;
- `deploy.chart`: the files, written through `specbuild.artifacts.stage_output` (stage "deploy"), so a folder this
  command did not write is never replaced.
Only existing engines run the chart: Kubernetes (Job, Deployment, Service, PodDisruptionBudget, autoscaling/v2 HPA),
LeaderWorkerSet for multi-node, prometheus-operator's ServiceMonitor/PodMonitor, prometheus-adapter or KEDA.
"""
