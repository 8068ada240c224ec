{{/* Names and labels (Kubernetes' recommended app.kubernetes.io labels). */}}
{{- define "specbuild.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "specbuild.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/instance: {{ .Release.Name | quote }}
{{- end -}}

{{- define "specbuild.labels" -}}
{{ include "specbuild.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end -}}

{{- define "specbuild.image" -}}
{{ printf "%s:%s" .Values.image.repository .Values.image.tag | quote }}
{{- end -}}

{{/* The spec's tp_size and pp_size, read from the spec text itself (one place). */}}
{{- define "specbuild.worldSize" -}}
{{- $tp := regexFind "(?m)^tp_size *= *[0-9]+" .Values.spec | regexFind "[0-9]+$" | default "1" | int -}}
{{- $pp := regexFind "(?m)^pp_size *= *[0-9]+" .Values.spec | regexFind "[0-9]+$" | default "1" | int -}}
{{- mul $tp $pp -}}
{{- end -}}

{{/* The build key: engines are specific to the spec, the image (TensorRT-LLM's version) and the GPU product. */}}
{{- define "specbuild.buildKey" -}}
{{- printf "%s\n%s:%s\n%s\n%s" .Values.spec .Values.image.repository .Values.image.tag .Values.gpu.name .Values.backend | sha256sum | trunc 12 -}}
{{- end -}}

{{- define "specbuild.enginesClaim" -}}
{{- .Values.storage.existingClaim | default (printf "%s-engines" (include "specbuild.fullname" .)) -}}
{{- end -}}

{{- define "specbuild.productLabels" -}}
{{- $known := .Files.Get "gpu-products.json" | fromJson -}}
{{- .Values.gpu.productLabels | default (get $known .Values.gpu.name) | toJson -}}
{{- end -}}

{{/* Values Helm's schema cannot compare with each other: refused here, each message naming the value. */}}
{{- define "specbuild.validate" -}}
{{- $world := include "specbuild.worldSize" . | int -}}
{{- $known := .Files.Get "gpu-products.json" | fromJson -}}
{{- if .Values.gpu.enabled -}}
{{- if not (hasKey $known .Values.gpu.name) -}}
{{- fail (printf "gpu.name = %q is not a GPU specbuild knows: choose one of %s (the spec's [gpu] names)" .Values.gpu.name (keys $known | sortAlpha | join ", ")) -}}
{{- end -}}
{{- if lt (mul (int .Values.gpu.count) (int .Values.nodes)) $world -}}
{{- fail (printf "gpu.count = %d (x nodes = %d) is below the spec's tp_size x pp_size = %d: raise gpu.count" (int .Values.gpu.count) (int .Values.nodes) $world) -}}
{{- end -}}
{{- else if ne .Values.backend "reference" -}}
{{- fail (printf "gpu.enabled = false: backend %q runs only on NVIDIA GPUs (use backend reference for CPU)" .Values.backend) -}}
{{- end -}}
{{- if gt (int .Values.autoscaling.minReplicas) (int .Values.autoscaling.maxReplicas) -}}
{{- fail (printf "autoscaling.minReplicas = %d exceeds autoscaling.maxReplicas = %d" (int .Values.autoscaling.minReplicas) (int .Values.autoscaling.maxReplicas)) -}}
{{- end -}}
{{- if and .Values.openai.enabled (or (eq .Values.backend "llmapi") (gt (int .Values.nodes) 1)) -}}
{{- fail (printf "openai.enabled: NVIDIA's OpenAI frontend serves the engine path's repository on one node (backend %q, nodes = %d)" .Values.backend (int .Values.nodes)) -}}
{{- end -}}
{{- if gt (int .Values.nodes) 1 -}}
{{- if ne .Values.backend "llmapi" -}}
{{- fail (printf "nodes = %d: only backend llmapi spans nodes (the engine path's orchestrator mode is single-node); use replicas" (int .Values.nodes)) -}}
{{- end -}}
{{- if mod $world (int .Values.nodes) -}}
{{- fail (printf "nodes = %d does not divide the spec's tp_size x pp_size = %d" (int .Values.nodes) $world) -}}
{{- end -}}
{{- if not .Values.multiNode.launch -}}
{{- fail "multiNode.launch is empty: write the chart with `specbuild deploy --nodes N`" -}}
{{- end -}}
{{- if not (has (toString .Values.ports.http) .Values.multiNode.launch) -}}
{{- fail (printf "ports.http = %d is not the --port of multiNode.launch: change both together" (int .Values.ports.http)) -}}
{{- end -}}
{{- if ne .Values.autoscaling.engine "none" -}}
{{- fail "autoscaling.engine: the LLM API path has no BLS queue metric to scale on; set it to none" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Volumes shared by the build Job and the serving pods. */}}
{{- define "specbuild.volumes" -}}
- name: spec
  configMap:
    name: {{ include "specbuild.fullname" . }}-spec
- name: engines
  persistentVolumeClaim:
    claimName: {{ include "specbuild.enginesClaim" . | quote }}
- name: models
  persistentVolumeClaim:
    claimName: {{ .Values.models.existingClaim | default (include "specbuild.enginesClaim" .) | quote }}
    readOnly: true
{{- end -}}

{{- define "specbuild.volumeMounts" -}}
- name: spec
  mountPath: /etc/specbuild
  readOnly: true
- name: engines
  mountPath: /work
  subPath: {{ include "specbuild.buildKey" . | quote }}
- name: engines
  mountPath: /engines
  subPath: {{ printf "%s/engines" (include "specbuild.buildKey" .) | quote }}
- name: models
  mountPath: /models
  readOnly: true
  {{- if not .Values.models.existingClaim }}
  subPath: models
  {{- else if .Values.models.subPath }}
  subPath: {{ .Values.models.subPath | quote }}
  {{- end }}
{{- end -}}

{{/* GPU scheduling: the product's nodes, the GPU taint tolerated. */}}
{{- define "specbuild.gpuScheduling" -}}
{{- if .Values.gpu.enabled }}
affinity:
  nodeAffinity:
    requiredDuringSchedulingIgnoredDuringExecution:
      nodeSelectorTerms:
        - matchExpressions:
            - key: nvidia.com/gpu.product
              operator: In
              values: {{ include "specbuild.productLabels" . }}
tolerations: {{ toJson .Values.gpu.tolerations }}
{{- end }}
{{- with .Values.imagePullSecrets }}
imagePullSecrets: {{ toJson . }}
{{- end }}
{{- end -}}

{{- define "specbuild.resources" -}}
{{- $resources := deepCopy .Values.resources -}}
{{- if .Values.gpu.enabled -}}
{{- $gpu := dict .Values.gpu.resource (int .Values.gpu.count) -}}
{{- $_ := set $resources "requests" (merge (deepCopy (default (dict) $resources.requests)) $gpu) -}}
{{- $_ := set $resources "limits" (merge (deepCopy (default (dict) $resources.limits)) $gpu) -}}
{{- end -}}
{{- toJson $resources -}}
{{- end -}}

{{/* Wait until the build's manifests exist (each is written last, when its folder is complete). */}}
{{- define "specbuild.waitForBuild" -}}
- name: wait-for-build
  image: {{ include "specbuild.image" . }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  command:
    - /bin/sh
    - -c
    - {{ printf "until %s; do echo waiting for the build job: %s; sleep 10; done" (include "specbuild.allExist" .) (join " " .Values.build.waitFor) | quote }}
  volumeMounts: {{- include "specbuild.volumeMounts" . | nindent 4 }}
{{- end -}}

{{- define "specbuild.allExist" -}}
{{- $tests := list -}}
{{- range .Values.build.waitFor -}}
{{- $tests = append $tests (printf "[ -f %s ]" (squote .)) -}}
{{- end -}}
{{- join " && " $tests -}}
{{- end -}}
