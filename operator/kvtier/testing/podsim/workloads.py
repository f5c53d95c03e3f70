"""What kube-controller-manager's StatefulSet, Deployment and Job controllers do, for the embedded cluster."""

from __future__ import annotations

import json
import re
from typing import Any

from kvtier.kube import DEPLOYMENTS, JOBS, PERSISTENT_VOLUME_CLAIMS, PODS, STATEFULSETS, APIError, KubeClient
from kvtier.testing.podsim.objects import is_ready, job_condition, now, owner_reference, template_hash


class WorkloadControllers:
    """StatefulSets, Deployments and Jobs -> pods and claims (see the package docstring for the simplifications)."""

    kube: KubeClient

    async def _reconcile_statefulset(self, sts: dict[str, Any], pods: list[dict[str, Any]]) -> None:
        if sts["metadata"].get("deletionTimestamp"):
            return
        spec, name, namespace = sts["spec"], sts["metadata"]["name"], sts["metadata"]["namespace"]
        replicas = spec.get("replicas", 1)
        revision = template_hash(spec["template"])
        by_ordinal = {
            int(p["metadata"]["name"].rsplit("-", 1)[1]): p for p in pods if re.search(r"-\d+$", p["metadata"]["name"])
        }
        for ordinal in range(replicas):
            await self._ensure_claims(sts, ordinal)
        ordered = spec.get("podManagementPolicy", "OrderedReady") == "OrderedReady"
        for ordinal in range(replicas):
            if ordinal in by_ordinal:
                continue
            if ordered and not all(o in by_ordinal and is_ready(by_ordinal[o]) for o in range(ordinal)):
                break
            await self._create_pod(
                sts,
                f"{name}-{ordinal}",
                revision,
                {
                    "apps.kubernetes.io/pod-index": str(ordinal),
                    "statefulset.kubernetes.io/pod-name": f"{name}-{ordinal}",
                },
                hostname=f"{name}-{ordinal}",
                subdomain=spec.get("serviceName"),
                ordinal=ordinal,
            )
        for ordinal in sorted((o for o in by_ordinal if o >= replicas), reverse=True):
            await self.kube.delete(PODS, namespace, by_ordinal[ordinal]["metadata"]["name"])
            if ordered:
                break
        if (spec.get("persistentVolumeClaimRetentionPolicy") or {}).get("whenScaled") == "Delete":
            await self._delete_condemned_claims(sts, set(by_ordinal))
        current = [by_ordinal[o] for o in sorted(by_ordinal) if o < replicas]
        outdated = [
            p for p in current if p["metadata"]["labels"].get("controller-revision-hash") != f"{name}-{revision}"
        ]
        if outdated and len(current) == replicas and all(is_ready(p) for p in current):
            await self.kube.delete(PODS, namespace, outdated[-1]["metadata"]["name"])
        ready = sum(is_ready(p) for p in current)
        updated = len(current) - len(outdated)
        status = {
            "observedGeneration": sts["metadata"].get("generation", 1),
            "replicas": len(current),
            "readyReplicas": ready,
            "availableReplicas": ready,
            "currentReplicas": updated,
            "updatedReplicas": updated,
            "currentRevision": f"{name}-{revision}",
            "updateRevision": f"{name}-{revision}",
        }
        if any((sts.get("status") or {}).get(k) != v for k, v in status.items()):
            await self.kube.patch(STATEFULSETS, namespace, name, {"status": status}, subresource="status")

    async def _delete_condemned_claims(self, sts: dict[str, Any], running: set[int]) -> None:
        """`whenScaled: Delete`: the claims of ordinals beyond `replicas` go once their pod has."""
        name, namespace = sts["metadata"]["name"], sts["metadata"]["namespace"]
        prefixes = [f"{t['metadata']['name']}-{name}-" for t in sts["spec"].get("volumeClaimTemplates", [])]
        for claim in (await self.kube.list(PERSISTENT_VOLUME_CLAIMS, namespace))["items"]:
            claim_name = claim["metadata"]["name"]
            suffix = next((claim_name[len(p) :] for p in prefixes if claim_name.startswith(p)), "")
            if suffix.isdigit() and int(suffix) >= sts["spec"].get("replicas", 1) and int(suffix) not in running:
                await self.kube.delete(PERSISTENT_VOLUME_CLAIMS, namespace, claim_name)

    async def _ensure_claims(self, sts: dict[str, Any], ordinal: int) -> None:
        name, namespace = sts["metadata"]["name"], sts["metadata"]["namespace"]
        retention = (sts["spec"].get("persistentVolumeClaimRetentionPolicy") or {}).get("whenDeleted", "Retain")
        for template in sts["spec"].get("volumeClaimTemplates", []):
            claim = f"{template['metadata']['name']}-{name}-{ordinal}"
            if await self.kube.get_or_none(PERSISTENT_VOLUME_CLAIMS, namespace, claim) is not None:
                continue
            labels = {
                **(template["metadata"].get("labels") or {}),
                **(sts["spec"]["selector"].get("matchLabels") or {}),
            }
            metadata: dict[str, Any] = {"name": claim, "namespace": namespace, "labels": labels}
            if retention == "Delete":
                metadata["ownerReferences"] = [owner_reference(sts)]
            body = {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": metadata, "spec": template["spec"]}
            await self.kube.create(PERSISTENT_VOLUME_CLAIMS, body)

    async def _create_pod(
        self,
        owner: dict[str, Any],
        name: str,
        revision: str,
        labels: dict[str, str],
        *,
        hostname: str | None = None,
        subdomain: str | None = None,
        ordinal: int | None = None,
    ) -> None:
        template = owner["spec"]["template"]
        owner_name, namespace = owner["metadata"]["name"], owner["metadata"]["namespace"]
        spec = json.loads(json.dumps(template["spec"]))
        if ordinal is not None:
            volumes = spec.setdefault("volumes", [])
            for claim_template in owner["spec"].get("volumeClaimTemplates", []):
                claim_name = claim_template["metadata"]["name"]
                volumes.append(
                    {"name": claim_name, "persistentVolumeClaim": {"claimName": f"{claim_name}-{owner_name}-{ordinal}"}}
                )
        if hostname:
            spec["hostname"] = hostname
        if subdomain:
            spec["subdomain"] = subdomain
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "labels": {
                    **(template["metadata"].get("labels") or {}),
                    **labels,
                    "controller-revision-hash": f"{owner_name}-{revision}",
                },
                "annotations": template["metadata"].get("annotations") or {},
                "ownerReferences": [owner_reference(owner)],
            },
            "spec": spec,
        }
        try:
            await self.kube.create(PODS, pod)
        except APIError as error:
            if error.status != 409:  # created by an earlier pass that the list did not show yet
                raise

    # -- Deployment controller ---------------------------------------------------------------------

    async def _reconcile_deployment(self, deployment: dict[str, Any], pods: list[dict[str, Any]]) -> None:
        if deployment["metadata"].get("deletionTimestamp"):
            return
        name, namespace = deployment["metadata"]["name"], deployment["metadata"]["namespace"]
        replicas = deployment["spec"].get("replicas", 1)
        revision = template_hash(deployment["spec"]["template"])
        label = f"{name}-{revision}"
        current = [p for p in pods if p["metadata"]["labels"].get("controller-revision-hash") == label]
        outdated = [p for p in pods if p not in current]
        taken = {p["metadata"]["name"] for p in pods}
        index = 0
        for _ in range(replicas - len(current)):
            while f"{name}-{revision}-{index}" in taken:
                index += 1
            await self._create_pod(deployment, f"{name}-{revision}-{index}", revision, {})
            index += 1
        for pod in current[replicas:]:
            await self.kube.delete(PODS, namespace, pod["metadata"]["name"])
        if len(current) >= replicas and all(is_ready(p) for p in current[:replicas]):
            for pod in outdated:
                await self.kube.delete(PODS, namespace, pod["metadata"]["name"])
        ready = sum(is_ready(p) for p in current[:replicas])
        status = {
            "observedGeneration": deployment["metadata"].get("generation", 1),
            "replicas": len(pods),
            "updatedReplicas": min(len(current), replicas),
            "readyReplicas": ready,
            "availableReplicas": ready,
        }
        if any((deployment.get("status") or {}).get(k) != v for k, v in status.items()):
            await self.kube.patch(DEPLOYMENTS, namespace, name, {"status": status}, subresource="status")

    # -- Job controller ----------------------------------------------------------------------------

    async def _reconcile_job(self, job: dict[str, Any], pods: list[dict[str, Any]]) -> None:
        if job["metadata"].get("deletionTimestamp"):
            return
        name, namespace = job["metadata"]["name"], job["metadata"]["namespace"]
        status = job.get("status") or {}
        if any(
            c.get("type") in ("Complete", "Failed") and c.get("status") == "True" for c in status.get("conditions", [])
        ):
            return
        phases = [(p.get("status") or {}).get("phase") for p in pods]
        succeeded, failed = phases.count("Succeeded"), phases.count("Failed")
        active = sum(
            1
            for p, phase in zip(pods, phases)
            if phase not in ("Succeeded", "Failed") and not p["metadata"].get("deletionTimestamp")
        )
        backoff_limit = job["spec"].get("backoffLimit", 6)
        new: dict[str, Any] = {
            "active": active,
            "succeeded": succeeded,
            "failed": failed,
            "startTime": status.get("startTime") or now(),
        }
        if succeeded:
            new.update(
                active=0,
                completionTime=now(),
                conditions=[
                    job_condition(
                        "SuccessCriteriaMet", "CompletionsReached", "Reached expected number of succeeded pods"
                    ),
                    job_condition("Complete", "CompletionsReached", "Reached expected number of succeeded pods"),
                ],
            )
        elif failed > backoff_limit:
            new["conditions"] = [
                job_condition("FailureTarget", "BackoffLimitExceeded", "Job has reached the specified backoff limit"),
                job_condition("Failed", "BackoffLimitExceeded", "Job has reached the specified backoff limit"),
            ]
        elif not active:
            await self._create_job_pod(job)
            new["active"] = 1
        if any(status.get(k) != v for k, v in new.items() if k not in ("startTime", "completionTime")):
            await self.kube.patch(JOBS, namespace, name, {"status": new}, subresource="status")

    async def _create_job_pod(self, job: dict[str, Any]) -> None:
        template = job["spec"]["template"]
        name = job["metadata"]["name"]
        labels = {
            "batch.kubernetes.io/job-name": name,
            "job-name": name,
            "batch.kubernetes.io/controller-uid": job["metadata"]["uid"],
        }
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "generateName": f"{name}-",
                "namespace": job["metadata"]["namespace"],
                "labels": {**(template["metadata"].get("labels") or {}), **labels},
                "annotations": template["metadata"].get("annotations") or {},
                "ownerReferences": [owner_reference(job)],
            },
            "spec": json.loads(json.dumps(template["spec"])),
        }
        await self.kube.create(PODS, pod)
