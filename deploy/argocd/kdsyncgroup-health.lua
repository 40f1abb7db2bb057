-- Argo CD health check for kdsync.io/KdsyncGroup.
-- Install as resource.customizations.health.kdsync.io_KdsyncGroup in argocd-cm
-- (see argocd-cm-health.yaml next to this file, and docs/gitops.md).
--
-- Maps the operator's conditions to Argo CD health:
--   status not yet written, or written for an older generation -> Progressing
--   Degraded=True                                              -> Degraded
--   Consistent=False (the last audit found violations)         -> Degraded
--   Ready=True                                                 -> Healthy
--   Progressing=True                                           -> Progressing
--   anything else (Ready=False, no rollout under way)          -> Degraded
local hs = {}

local function find(conditions, kind)
  if conditions == nil then
    return nil
  end
  for _, condition in ipairs(conditions) do
    if condition.type == kind then
      return condition
    end
  end
  return nil
end

local function describe(condition, fallback)
  if condition == nil then
    return fallback
  end
  local text = condition.reason or ""
  if condition.message ~= nil and condition.message ~= "" then
    text = text .. ": " .. condition.message
  end
  if text == "" then
    return fallback
  end
  return text
end

local generation = 0
if obj.metadata ~= nil and obj.metadata.generation ~= nil then
  generation = obj.metadata.generation
end

if obj.status == nil or obj.status.conditions == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the kdsync operator to report status"
  return hs
end

local observed = obj.status.observedGeneration or 0
if observed < generation then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to observe generation " .. tostring(generation)
  return hs
end

local conditions = obj.status.conditions
local ready = find(conditions, "Ready")
local progressing = find(conditions, "Progressing")
local degraded = find(conditions, "Degraded")
local consistent = find(conditions, "Consistent")

if degraded ~= nil and degraded.status == "True" then
  hs.status = "Degraded"
  hs.message = describe(degraded, "The group is degraded")
  return hs
end

if consistent ~= nil and consistent.status == "False" then
  hs.status = "Degraded"
  hs.message = describe(consistent, "The last consistency audit found violations")
  return hs
end

if ready ~= nil and ready.status == "True" then
  hs.status = "Healthy"
  hs.message = describe(ready, "All members ready")
  return hs
end

if progressing ~= nil and progressing.status == "True" then
  hs.status = "Progressing"
  hs.message = describe(progressing, "Rolling out")
  return hs
end

hs.status = "Degraded"
hs.message = describe(ready, "The group is not ready")
return hs
