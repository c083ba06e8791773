-- Argo CD health check for arbiter.dev/DecisionModel (see docs/argocd.md).
-- Install as resource.customizations.health.arbiter.dev_DecisionModel in argocd-cm (Argo CD owns that ConfigMap;
-- docs/install.md has the snippet).
--
-- Healthy      the operator has seen the current spec, and the version it names serves all traffic (Ready=True).
-- Progressing  the operator has not caught up with the spec yet, or a promotion is running (deploying, waiting for
--              the candidate to become ready, canary steps), or the old candidate is still being stopped.
-- Suspended    a canary step is held because it sees too little traffic to judge (insufficientTraffic: Wait), or
--              the shadow phase waits for enough mirrored requests to compare: it resumes by itself when traffic
--              comes, or fails at the progress deadline. Also while a promotion that passed its analysis waits for
--              approval (phase Paused, approval: Required): kubectl arbiter approve lets it finish.
-- Degraded     Stalled=True: a promotion failed and was rolled back (AnalysisFailed, ProgressDeadlineExceeded,
--              ShadowAnalysisFailed, CandidateFailed, Aborted), or the spec cannot be served; the stable version keeps
--              serving.
--              Also when nothing serves and the operator is not working on it.
local hs = {}

local function condition(ctype)
  if obj.status == nil or obj.status.conditions == nil then
    return nil
  end
  for _, c in ipairs(obj.status.conditions) do
    if c.type == ctype then
      return c
    end
  end
  return nil
end

local function msg(c, fallback)
  if c ~= nil and c.message ~= nil and c.message ~= "" then
    return c.message
  end
  return fallback
end

if obj.status == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the Arbiter operator to report status"
  return hs
end

local generation = 0
if obj.metadata ~= nil and obj.metadata.generation ~= nil then
  generation = obj.metadata.generation
end
local observed = obj.status.observedGeneration
if observed == nil then
  local ready = condition("Ready")
  if ready ~= nil then
    observed = ready.observedGeneration
  end
end
if observed == nil or observed < generation then
  hs.status = "Progressing"
  hs.message = "Waiting for the Arbiter operator to observe generation " .. tostring(generation)
  return hs
end

local ready = condition("Ready")
local stalled = condition("Stalled")
local reconciling = condition("Reconciling")
local promotion = obj.status.promotion or {}
local phase = promotion.phase or "Idle"

-- Who serves, from status.promotion (not from a condition's wording): named in every Degraded message.
local function serving_note()
  if promotion.stable ~= nil and promotion.stable ~= "" then
    return "stable version " .. promotion.stable .. " keeps serving"
  end
  return "no stable version serves yet"
end

if stalled ~= nil and stalled.status == "True" then
  hs.status = "Degraded"
  if phase == "Failed" then
    local version = promotion.failedVersion or promotion.candidate or "the candidate"
    local reason = promotion.failureReason or stalled.reason or "PromotionFailed"
    local why = promotion.failureMessage
    if why == nil or why == "" then
      why = msg(stalled, "the promotion failed")
    end
    hs.message = reason .. ": promotion of " .. version .. " failed and was rolled back (" .. why .. "); "
      .. serving_note()
  else
    hs.message = (stalled.reason or "Stalled") .. ": " .. msg(stalled, "the operator cannot progress without a change")
      .. "; " .. serving_note()
  end
  return hs
end

if ready ~= nil and ready.status == "True" then
  hs.status = "Healthy"
  hs.message = msg(ready, "Ready")
  return hs
end

if phase == "Paused" then
  hs.status = "Suspended"
  hs.message = "Waiting for approval: " .. (promotion.candidate or "the candidate")
    .. " passed its analysis; approve with kubectl arbiter approve (the arbiter.dev/approve annotation), or abort"
  return hs
end

if phase == "Progressing" or phase == "Shadowing" then
  local last = promotion.lastAnalysis
  if last ~= nil and last.verdict == "NoData" and last.step == promotion.step then
    hs.status = "Suspended"
    if phase == "Shadowing" then
      hs.message = "Shadow phase waits for data: " .. (last.message or "")
    else
      hs.message = "Canary step " .. tostring((promotion.step or 0) + 1) .. " waits for traffic: "
        .. (last.message or "")
    end
    return hs
  end
end

local busy = phase == "Deploying" or phase == "Waiting" or phase == "Progressing" or phase == "RollingBack"
  or phase == "Aborted" or phase == "Shadowing"
if busy or (reconciling ~= nil and reconciling.status == "True") then
  hs.status = "Progressing"
  hs.message = msg(ready, msg(reconciling, "Promotion in progress"))
  return hs
end

if ready == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the Arbiter operator to report readiness"
  return hs
end

hs.status = "Degraded"
hs.message = (ready.reason or "NotReady") .. ": " .. msg(ready, "not ready")
return hs
