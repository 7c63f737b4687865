//! `lab exec`, `lab ctl`, `lab kubeconfig` and `lab kubectl`: running things against the lab.

use super::*;

pub(super) fn exec_cmd(which: &Which, pod: &str, command: &[String]) -> Result<u8, LabError> {
    let st = load(which)?;
    let p = st
        .pod(pod)
        .ok_or_else(|| other(format!("no pod {pod:?} (pods: {:?})", pod_ids(&st))))?;
    let Some((prog, args)) = command.split_first() else {
        return Err(other("exec: give a command after --"));
    };
    let status = net::in_netns(&p.netns, prog)
        .args(args)
        .status()
        .map_err(|e| other(format!("exec in {pod}: {e}")))?;
    Ok(status.code().map_or(1, |c| u8::try_from(c).unwrap_or(1)))
}

pub(super) fn kubeconfig_cmd(
    which: &Which,
    content: bool,
    out: &mut dyn Write,
) -> Result<u8, LabError> {
    let st = load(which)?;
    if !st.is_kubernetes() {
        return Err(other(format!(
            "lab {:?} runs on the {} datastore; only `margay lab up --datastore kubernetes` has a Kubernetes API",
            st.name, st.datastore
        )));
    }
    let path = st.kubeconfig();
    if content {
        let text = std::fs::read_to_string(&path)
            .map_err(|e| other(format!("{}: {e}", path.display())))?;
        let _ = write!(out, "{text}");
    } else {
        let _ = writeln!(out, "{}", path.display());
    }
    Ok(0)
}

pub(super) fn kubectl_cmd(which: &Which, args: &[String]) -> Result<u8, LabError> {
    let st = load(which)?;
    if !st.is_kubernetes() {
        return Err(other(format!(
            "lab {:?} runs on the {} datastore; kubectl needs `margay lab up --datastore kubernetes`",
            st.name, st.datastore
        )));
    }
    let status = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(st.kubeconfig())
        .args(args)
        .status()
        .map_err(|e| other(format!("kubectl (is it installed?): {e}")))?;
    Ok(status.code().map_or(1, |c| u8::try_from(c).unwrap_or(1)))
}

pub(super) fn ctl_cmd(which: &Which, args: &[String]) -> Result<u8, LabError> {
    let st = load(which)?;
    let status = margay_in(&st, &st.fabric_netns())?
        .arg("ctl")
        .args(args)
        .status()
        .map_err(|e| other(format!("margay ctl: {e}")))?;
    Ok(status.code().map_or(1, |c| u8::try_from(c).unwrap_or(1)))
}
