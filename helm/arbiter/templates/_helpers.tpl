{{/* Names and labels. */}}
{{- define "arbiter.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "arbiter.fullname" -}}
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

{{- define "arbiter.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "arbiter.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false: name the ServiceAccount an administrator created for the operator" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "arbiter.selectorLabels" -}}
app.kubernetes.io/name: {{ include "arbiter.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "arbiter.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "arbiter.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: arbiter
{{- end -}}

{{- define "arbiter.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{/*
RBAC rules, one list used by the ClusterRole (all namespaces) and by each per-namespace Role (watchedNamespaces).
Every rule is exercised by the reconcile and promotion scenarios run as this ServiceAccount (tests/cluster/security); the
reason for each is in docs/security.md. Keep the three in step.
*/}}
{{- define "arbiter.namespacedRules" -}}
# The DecisionModel: listed and watched; the reconcile reads it from the watch cache. get: read whole once by the
# pass that starts a promotion (the cache holds no managedFields: who wrote spec.promote.version goes into the
# promotion's history). patch: metadata only: the finalizer that archives its registry versions on delete (only with
# spec.registry), and the one-time removal of kopf's annotations earlier builds wrote (registry_handlers.py). The
# operator never writes its spec.
- apiGroups: ["arbiter.dev"]
  resources: ["decisionmodels"]
  verbs: ["get", "list", "watch", "patch"]
# Status is the only thing the operator writes about a DecisionModel (conditions, promotion progress).
- apiGroups: ["arbiter.dev"]
  resources: ["decisionmodels/status"]
  verbs: ["patch"]
# Children are written by server-side apply: a `patch`, which needs `create` too when the object is new. They are
# watched (kopf, by the arbiter.dev/decision-model label) and listed to see drift; a name not found among the
# DecisionModel's own is created with a create-only apply, which the apiserver refuses when the name is taken, and
# only then read (get) to tell a foreign object (never written) from one of ours that lost its label;
# InferenceServices and decision ConfigMaps of retired versions are deleted (everything else goes with the
# DecisionModel through owner references).
- apiGroups: ["serving.kserve.io"]
  resources: ["inferenceservices"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# get: CA bundles named by spec.storage.caBundleConfigMapRef and spec.registry.caBundleConfigMapRef, read by name,
# and a decision ConfigMap's name read before it is created.
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# One ServingRuntime and one Route per DecisionModel, read by name.
- apiGroups: ["serving.kserve.io"]
  resources: ["servingruntimes"]
  verbs: ["get", "list", "watch", "create", "patch"]
- apiGroups: ["route.openshift.io"]
  resources: ["routes"]
  verbs: ["get", "list", "watch", "create", "patch"]
# OpenShift checks this virtual subresource before it accepts a Route with spec.host set (spec.exposure.host).
- apiGroups: ["route.openshift.io"]
  resources: ["routes/custom-host"]
  verbs: ["create"]
# One PodMonitor and one PrometheusRule (the model's alerts) per DecisionModel (where prometheus-operator is
# installed), applied, watched (a deleted one is put back), their names read before they are created; they go with
# the DecisionModel through its owner reference. Whether the API is served is read from discovery (no grant needed).
- apiGroups: ["monitoring.coreos.com"]
  resources: ["podmonitors", "prometheusrules"]
  verbs: ["get", "list", "watch", "create", "patch"]
# One Service per DecisionModel (named after it) that follows the stable version; applied, watched (drift), its
# name read before it is created, and gone with the DecisionModel through its owner reference. KServe's own
# per-version Services are not touched.
- apiGroups: [""]
  resources: ["services"]
  verbs: ["get", "list", "watch", "create", "patch"]
# Read only, by name: the S3 storage-config Secret (spec.storage.secretName) and the registry token Secret
# (spec.registry.tokenSecretRef). No list or watch: the operator never sees Secrets it was not pointed at.
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["get"]
# Read only, watched (the watch cache holds those with KServe's label serving.kserve.io/inferenceservice): the
# predictor Deployments KServe makes (a version is ready when KServe says so and its Deployment has an available
# replica) and their pods (the scheduler's Unschedulable message, a crash loop's restart count and exit reason).
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["list", "watch"]
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list", "watch"]
# Grants of `get` on the DecisionModel's own InferenceServices (by name), each a Role and its RoleBinding: to the
# callers spec.access names (every live version, updated as versions come and go), and, only while a shadow phase
# runs with auth on, to the predictor pods' ServiceAccount (the stable version calls the candidate). Watched by the
# operator's label (drift), read by name when a create finds the name taken, deleted when no longer wanted. The
# operator holds that `get` itself, so no escalate or bind verb is needed.
- apiGroups: ["rbac.authorization.k8s.io"]
  resources: ["roles", "rolebindings"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# spec.access.network: one NetworkPolicy per DecisionModel on its predictor pods, applied, watched (drift), its name
# read before it is created, deleted when spec.access.network goes.
- apiGroups: ["networking.k8s.io"]
  resources: ["networkpolicies"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# Events on DecisionModels, posted by the operator on transitions (kopf's own event posting is off); a reason that
# repeats on the same DecisionModel within 10 minutes updates the earlier Event's count (patch) instead.
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create", "patch"]
# spec.registry.modelRegistryRef: the ModelRegistry's status gives the registry's REST address.
- apiGroups: ["modelregistry.opendatahub.io"]
  resources: ["modelregistries"]
  verbs: ["get"]
{{- if .Values.prometheus.tenancy }}
# Not a request the operator makes: what Thanos Querier's tenancy port (kube-rbac-proxy) asks the apiserver before it
# answers the promotion analysis's queries about a namespace with the operator's token (a GET: verb get).
- apiGroups: ["metrics.k8s.io"]
  resources: ["pods"]
  verbs: ["get"]
{{- end }}
{{- end -}}

{{/* Cluster-scoped grants, by a ClusterRole in both modes: reading namespaces; the metrics filter's reviews. */}}
{{- define "arbiter.clusterRules" -}}
# Namespace labels decide the Istio sidecar exclusion (spec.mesh.sidecar: auto); each namespace holding
# DecisionModels is read and watched alone (fieldSelector metadata.name, which resourceNames can grant).
- apiGroups: [""]
  resources: ["namespaces"]
  verbs: ["get", "list", "watch"]
{{- if .resourceNames }}
  resourceNames:
{{ toYaml .resourceNames | indent 4 }}
{{- end }}
{{- if .metrics.auth }}
# The metrics endpoint's filter (metrics.auth): a scraper's bearer token is reviewed by the API server (who is it?
# may it get /metrics?), as controller-runtime's metrics filter and the system:auth-delegator role do. Both reviews
# are cluster-scoped objects the API server answers and never stores.
- apiGroups: ["authentication.k8s.io"]
  resources: ["tokenreviews"]
  verbs: ["create"]
- apiGroups: ["authorization.k8s.io"]
  resources: ["subjectaccessreviews"]
  verbs: ["create"]
{{- end }}
{{- end -}}

{{/*
Serving certificates, for the webhook and the metrics endpoint alike. Each takes a dict:
  name   the Service (and the certificate's base name: its Secret is <name>-tls unless mode is secret)
  mode   openshift | certManager | secret | olm | none (what the value `certificates` says)
  given  the Secret named by the value `secret.name` (mode secret)
  issuerRef, root (the chart's context), volume (the pod volume's name)
*/}}
{{- define "arbiter.tlsSecretName" -}}
{{- eq .mode "secret" | ternary .given (printf "%s-tls" .name) -}}
{{- end -}}

{{/* The Service annotation that has OpenShift's service CA write (and rotate) the certificate into its Secret. */}}
{{- define "arbiter.servingCertAnnotation" -}}
{{- if eq .mode "openshift" -}}
service.beta.openshift.io/serving-cert-secret-name: {{ .name }}-tls
{{- end -}}
{{- end -}}

{{/* A cert-manager Certificate for the Service's DNS names, from issuerRef or a self-signed Issuer of its own. */}}
{{- define "arbiter.certManagerCertificate" -}}
{{- if not .issuerRef }}
apiVersion: cert-manager.io/v1
kind: Issuer
metadata:
  name: {{ .name }}
  namespace: {{ .root.Release.Namespace }}
  labels:
    {{- include "arbiter.labels" .root | nindent 4 }}
spec:
  selfSigned: {}
---
{{- end }}
apiVersion: cert-manager.io/v1
kind: Certificate
metadata:
  name: {{ .name }}
  namespace: {{ .root.Release.Namespace }}
  labels:
    {{- include "arbiter.labels" .root | nindent 4 }}
spec:
  secretName: {{ .name }}-tls
  dnsNames:
    - {{ .name }}.{{ .root.Release.Namespace }}.svc
    - {{ .name }}.{{ .root.Release.Namespace }}.svc.cluster.local
  issuerRef:
    {{- if .issuerRef }}
    {{- toYaml .issuerRef | nindent 4 }}
    {{- else }}
    kind: Issuer
    name: {{ .name }}
    {{- end }}
{{- end -}}

{{/* The pod volume holding the certificate pair, as the operator reads it (tls.crt and tls.key, re-read on change). */}}
{{- define "arbiter.tlsVolume" -}}
- name: {{ .volume }}
  secret:
    secretName: {{ include "arbiter.tlsSecretName" . }}
    items:
      - key: tls.crt
        path: tls.crt
      - key: tls.key
        path: tls.key
    defaultMode: 0440
{{- end -}}

{{/* The metrics endpoint's certificate, in the helpers' terms. */}}
{{- define "arbiter.metricsTLS" -}}
{{- $m := .Values.metrics -}}
{{- toYaml (dict "name" (printf "%s-metrics" (include "arbiter.fullname" .)) "mode" $m.certificates "given" $m.secret.name "issuerRef" $m.certManager.issuerRef "volume" "metrics-tls") -}}
{{- end -}}

{{/* The metrics-reader ClusterRole's name: `get` on the non-resource URL /metrics, what a scrape is judged by. */}}
{{- define "arbiter.metricsReader" -}}
{{- printf "%s-metrics-reader" (include "arbiter.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}
