"""invoke demo shows the converge as it runs: ansible-runner's events, one line per play and task."""

import textwrap

from dtlab import provision


def test_converge_reports_each_play_task_and_outcome_as_it_runs(tmp_path):
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(textwrap.dedent("""\
        all:
          vars: {ansible_connection: local, ansible_python_interpreter: "{{ ansible_playbook_python }}",
                 dtlab_cluster_name: progress}
          children:
            master: {hosts: {m: {ansible_host: 127.0.70.1}}}
            workers: {hosts: {w: {ansible_host: 127.0.70.2}}}
        """))
    playbook = tmp_path / "play.yml"
    playbook.write_text(textwrap.dedent("""\
        - name: Two steps
          hosts: all
          gather_facts: false
          tasks:
            - name: Say hello
              ansible.builtin.debug: {msg: hello}
            - name: Change something on the master only
              ansible.builtin.command: "true"
              changed_when: inventory_hostname == 'm'
        """))
    lines: list[str] = []
    result = provision.converge(inventory, playbook=str(playbook), progress=lines.append)
    assert result.ok, result.output[-2000:]
    steps = [line.split("] ", 1)[1] for line in lines]
    assert steps == ["PLAY Two steps", "  TASK Say hello", "       ok: m w",
                     "  TASK Change something on the master only", "       changed: m; ok: w"], lines
    assert all(line.startswith("[") and "s] " in line for line in lines), "each line has the elapsed time"
    quiet = provision.converge(inventory, playbook=str(playbook))
    assert quiet.ok and quiet.changed_hosts == {"m": 1}, "without progress the run is silent, same recap"
