{{/* The chart's name, and the release's full name (at most 63 characters, as DNS labels). */}}
{{- define "vigil.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "vigil.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* Labels on every object; the selector labels are the subset the pods, the Service,
the ServiceMonitor and the PodDisruptionBudget match on. */}}
{{- define "vigil.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "vigil.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: monitor
{{- end }}

{{- define "vigil.selectorLabels" -}}
app.kubernetes.io/name: {{ include "vigil.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "vigil.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "vigil.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "vigil.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* Where the pod finds its files. */}}
{{- define "vigil.configDir" -}}/etc/vigil{{- end }}
{{- define "vigil.stateDir" -}}/var/lib/vigil{{- end }}

{{/* The [kafka] file keys each kafkaSecret key is wired to. */}}
{{- define "vigil.secretFileKeys" -}}
{{- $s := .Values.kafkaSecret }}
{{- $keys := dict "ssl_cafile" $s.caKey "ssl_certfile" $s.certKey "ssl_keyfile" $s.keyKey "ssl_key_password_file" $s.keyPasswordKey }}
{{- if not $s.saslPasswordEnv }}
{{- $_ := set $keys "sasl_password_file" $s.saslPasswordKey }}
{{- end }}
{{- $out := dict }}
{{- range $setting, $key := $keys }}
{{- if $key }}
{{- $_ := set $out $setting $key }}
{{- end }}
{{- end }}
{{- toJson $out }}
{{- end }}

{{/* vigil.toml as the pod runs it, as JSON: the config value with the chart's settings
added, after the checks that keep a rendered pod from failing in ways only a cluster
would show. */}}
{{- define "vigil.config" -}}
{{- $config := deepCopy .Values.config }}
{{- if hasKey $config "files" }}
{{- fail "config.files: the chart runs the Kafka source; give config.kafka instead" }}
{{- end }}
{{- $kafka := required "config.kafka is required (at least bootstrap_servers)" $config.kafka }}
{{- $_ := required "config.kafka.bootstrap_servers is required" $kafka.bootstrap_servers }}
{{- if not $config.rules }}
{{- fail "config.rules: give at least one rule" }}
{{- end }}
{{- $metrics := default dict $config.metrics }}
{{- range $key := list "host" "port" }}
{{- if hasKey $metrics $key }}
{{- fail (printf "config.metrics.%s: the chart sets it (host 0.0.0.0, so probes and scrapes reach the pod; the port is metrics.port)" $key) }}
{{- end }}
{{- end }}
{{- if and (hasKey $metrics "enabled") (not $metrics.enabled) }}
{{- fail "config.metrics.enabled: the probes and the ServiceMonitor need the endpoint; it cannot be off" }}
{{- end }}
{{- $_ := set $metrics "host" "0.0.0.0" }}
{{- $_ := set $metrics "port" (int .Values.metrics.port) }}
{{- $_ := set $config "metrics" $metrics }}
{{- $state := default dict $config.state }}
{{- if not (hasKey $state "dir") }}
{{- $_ := set $state "dir" (printf "%s/state" (include "vigil.stateDir" .)) }}
{{- end }}
{{- $_ := set $config "state" $state }}
{{- $scaled := or .Values.keda.enabled .Values.autoscaling.enabled (gt (int .Values.replicaCount) 1) }}
{{- if and $kafka.transactional_id $scaled }}
{{- fail "config.kafka.transactional_id: with more than one replica the instances would fence each other; leave it unset (each pod derives its own from its hostname)" }}
{{- end }}
{{- $secret := .Values.kafkaSecret }}
{{- $files := fromJson (include "vigil.secretFileKeys" .) }}
{{- if and (or $files $secret.saslPasswordEnv) (not $secret.name) }}
{{- fail "kafkaSecret: keys are named but kafkaSecret.name (the Secret) is empty" }}
{{- end }}
{{- if and $secret.saslPasswordEnv (not $secret.saslPasswordKey) }}
{{- fail "kafkaSecret.saslPasswordEnv needs kafkaSecret.saslPasswordKey (the Secret's key with the password)" }}
{{- end }}
{{- range $setting, $key := $files }}
{{- if hasKey $kafka $setting }}
{{- fail (printf "config.kafka.%s: set by the chart from kafkaSecret; leave it out" $setting) }}
{{- end }}
{{- $_ := set $kafka $setting (printf "%s/%s" $secret.mountPath $key) }}
{{- end }}
{{- toJson $config }}
{{- end }}

{{/* The topics the rules read: a rule's topic, or a Seldon rule's model (or pipeline)
inputs and outputs topics, as the daemon names them. */}}
{{- define "vigil.topics" -}}
{{- $config := fromJson (include "vigil.config" .) }}
{{- $seldon := default dict $config.seldon }}
{{- $topics := list }}
{{- range $rule := $config.rules }}
{{- if eq (default "vigil" $rule.format) "seldon" }}
{{- $namespace := default (default "default" $seldon.namespace) $rule.seldon_namespace }}
{{- $base := printf "%s.%s.%s.%s" (default "seldon" $seldon.prefix) $namespace (default "model" $rule.seldon_kind) $rule.model }}
{{- $topics = append $topics (printf "%s.inputs" $base) }}
{{- $topics = append $topics (printf "%s.outputs" $base) }}
{{- else if $rule.topic }}
{{- $topics = append $topics $rule.topic }}
{{- end }}
{{- end }}
{{- toJson (uniq $topics) }}
{{- end }}

{{/* [shutdown] deadline_seconds, and the grace period that outlasts it. */}}
{{- define "vigil.gracePeriod" -}}
{{- $shutdown := default dict .Values.config.shutdown }}
{{- $deadline := default 30 $shutdown.deadline_seconds | float64 }}
{{- $grace := .Values.terminationGracePeriodSeconds }}
{{- if kindIs "invalid" $grace }}
{{- $grace = add (int (ceil $deadline)) 15 }}
{{- end }}
{{- if le (float64 $grace) $deadline }}
{{- fail (printf "terminationGracePeriodSeconds (%v) must exceed config.shutdown.deadline_seconds (%v): Kubernetes would kill the daemon before its shutdown (snapshot, commit) ends" $grace $deadline) }}
{{- end }}
{{- int $grace }}
{{- end }}

{{/* Turn the whole numbers of a mapping (values arrive as floats) back into integers,
in place, so that vigil.toml reads `port = 9464`, not `port = 9464.0`. */}}
{{- define "vigil.integers" -}}
{{- range $key, $value := . }}
{{- if kindIs "float64" $value }}
{{- if and (eq $value (floor $value)) (le $value 9e15) (ge $value -9e15) }}
{{- $_ := set $ $key (int64 $value) }}
{{- end }}
{{- else if kindIs "map" $value }}
{{- include "vigil.integers" $value }}
{{- else if kindIs "slice" $value }}
{{- $items := list }}
{{- range $item := $value }}
{{- $box := dict "item" $item }}
{{- include "vigil.integers" $box }}
{{- $items = append $items $box.item }}
{{- end }}
{{- $_ := set $ $key $items }}
{{- end }}
{{- end }}
{{- end }}
