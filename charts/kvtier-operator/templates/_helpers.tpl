{{/* Names and labels shared by every template. */}}

{{- define "kvtier.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "kvtier.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "kvtier.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kvtier.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "kvtier.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "kvtier.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: kvtier
{{- end -}}

{{- define "kvtier.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "kvtier.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "kvtier.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/*
The operator's permissions, least privilege: exactly the (verb, group, resource) triples the operator
(and kopf inside it) requests. The RBAC audit test (tests/e2e/test_rbac_audit.py) compares them with
the embedded API server's request log of the whole e2e suite, both ways.
*/}}

{{/* Cluster-scoped resources: always in the ClusterRole. */}}
{{- define "kvtier.rules.cluster" -}}
# kopf: discovers custom resources (and notices when CRDs change).
- apiGroups: ["apiextensions.k8s.io"]
  resources: ["customresourcedefinitions"]
  verbs: ["list", "watch"]
# The node index: does a replica fit on any node?
- apiGroups: [""]
  resources: ["nodes"]
  verbs: ["list", "watch"]
# KVPools: watched by kopf (finalizer and progress annotations are patches); the ledger lives in
# status, written with compare-and-swap (update) or merge patches (conditions).
- apiGroups: ["kvtier.io"]
  resources: ["kvpools"]
  verbs: ["get", "list", "watch", "patch"]
- apiGroups: ["kvtier.io"]
  resources: ["kvpools/status"]
  verbs: ["update", "patch"]
# Static NVMe-oF volumes: server-side applied, watched (the children index: pruning, drift), read and
# re-pointed at a wipe claim (spec.volumeReclaim: Wipe), deleted once reclaimed.
- apiGroups: [""]
  resources: ["persistentvolumes"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# Events that explain admissions, moves and failures: a KVPool's (cluster-scoped) go to `default`,
# whatever namespaces are watched.
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
# Whether a CSI class allows volume expansion (kvCache.storage.max grew).
- apiGroups: ["storage.k8s.io"]
  resources: ["storageclasses"]
  verbs: ["get"]
# Whether the operator's own namespace exists: released volumes are wiped there, and a pool says so when it
# is missing (deletion then goes ahead instead of retrying 404s forever).
- apiGroups: [""]
  resources: ["namespaces"]
  resourceNames: [{{ .Release.Namespace | quote }}]
  verbs: ["get"]
{{- if .Values.watchNamespaces }}
# kopf lists and watches namespaces when it serves named ones (it notices them appear and go).
- apiGroups: [""]
  resources: ["namespaces"]
  verbs: ["list", "watch"]
{{- end }}
{{- if and .Values.peering.enabled (not .Values.watchNamespaces) }}
# kopf peering (cluster-wide).
- apiGroups: ["kopf.dev"]
  resources: ["clusterkopfpeerings"]
  verbs: ["list", "watch", "patch"]
{{- end }}
{{- end -}}

{{/* Namespaced resources: in the ClusterRole (all namespaces), or in a Role per watched namespace. */}}
{{- define "kvtier.rules.namespaced" -}}
# InferenceDeployments: watched by kopf (finalizer, progress annotations), status by the operator.
- apiGroups: ["kvtier.io"]
  resources: ["inferencedeployments"]
  verbs: ["list", "watch", "patch"]
- apiGroups: ["kvtier.io"]
  resources: ["inferencedeployments/status"]
  verbs: ["patch"]
# Replicas: read for status, watched for telemetry's scrape targets; the quota readiness gate is a
# pod condition (pods/status).
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list", "watch"]
- apiGroups: [""]
  resources: ["pods/status"]
  verbs: ["update"]
# Children: server-side applied when they changed (an apply that creates is authorized as `create` too),
# listed and watched (the children index: drift, pruning what the spec no longer renders), deleted.
- apiGroups: [""]
  resources: ["services", "configmaps"]
  verbs: ["list", "watch", "create", "patch", "delete"]
- apiGroups: ["apps"]
  resources: ["statefulsets"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: ["policy"]
  resources: ["poddisruptionbudgets"]
  verbs: ["list", "watch", "create", "patch", "delete"]
# Per-replica volume claims (StatefulSet volumeClaimTemplates): watched (the children index), expanded
# when kvCache.storage.max grows (CSI), released with their deployment.
- apiGroups: [""]
  resources: ["persistentvolumeclaims"]
  verbs: ["get", "list", "watch", "patch", "delete"]
{{- if .Values.engines.podMonitor }}
# PodMonitors (engines.podMonitor): applied, listed and watched (the children index), deleted.
- apiGroups: ["monitoring.coreos.com"]
  resources: ["podmonitors"]
  verbs: ["list", "watch", "create", "patch", "delete"]
{{- end }}
{{- if and .Values.peering.enabled .Values.watchNamespaces }}
# kopf peering (per namespace).
- apiGroups: ["kopf.dev"]
  resources: ["kopfpeerings"]
  verbs: ["list", "watch", "patch"]
{{- end }}
{{- end -}}

{{/* The operator's own namespace: the claims and Jobs that wipe released static volumes. */}}
{{- define "kvtier.rules.self" -}}
- apiGroups: [""]
  resources: ["persistentvolumeclaims"]
  verbs: ["create", "get", "delete"]
- apiGroups: ["batch"]
  resources: ["jobs"]
  verbs: ["create", "get", "delete"]
{{- end -}}
