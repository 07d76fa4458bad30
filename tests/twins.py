# ruff: noqa: E501  (a table of node ids: one per line reads better than split strings)
"""Every slow test's fast twins (issue 22 item 1: "every invariant that a slow test guards
also has a fast test"), checked by tests/unit/test_fast_twins.py.

``TWINS`` maps a slow test (tests/conftest.py's slow tier) to the fast tests that guard the
same rule without a process being killed, paused or started per command: the pure cores
under tests/unit/, the simulation (tests/unit/simulation/), in-process broker tests
(tests/inproc.py), and wire tests against a module's broker. A key is a node id, a node id
without its parameters (every parameter), or a module's path (every test in it); a twin is
a node id, or one without its parameters. The comment above each entry names the invariant
(a README claim or a SPEC.md requirement).

``NO_TWIN`` holds the slow tests whose point is the real process itself (a README
walk-through run as written, an external program, a rate measured over seconds), with the
reason. Keep it short: anything with logic in it has a twin.

A new slow test must be added here: tests/unit/test_fast_twins.py fails until it is.
"""

from __future__ import annotations

U = "tests/unit/"
REP = "tests/unit/replication/"
SIM = "tests/unit/simulation/test_simulation.py::"
INT = "tests/integration/"

LEADER = REP + "test_leader_partition.py::"
CTRL_STATE = REP + "test_controller_state.py::"
CTRL = U + "test_controller.py::"
EPOCHS = REP + "test_epochs.py::"
FOLLOWER = U + "test_follower_log.py::"
LOG = U + "test_log.py::"
CLI = INT + "test_cli_inproc.py::"
RESTART = INT + "test_inproc_restart.py::"
WEB = INT + "test_web_console_inproc.py::"
SINK = INT + "test_transactional_sink_inproc.py::"
EPOCH_FOLLOWER = (INT + "test_inproc_epochs.py::"
                  "test_a_replica_that_does_not_lead_checks_the_epoch_first_and_deletes_nothing")

# R-SPARK-1/2: offsets planned, every record once per micro-batch plan, data loss reported,
# restarts resume from the checkpointed offsets; the sink writes keys, values, headers, and a
# replayed batch of its transactional mode adds nothing
SPARK_TWINS = (
    INT + "test_spark_source_inproc.py::test_micro_batches_read_every_record_once_in_order",
    U + "test_spark_offsets.py::test_plan_end_caps_by_limit_and_available_now_target",
    U + "test_spark_offsets.py::test_new_partition_enters_at_earliest_with_an_empty_range",
    U + "test_spark_offsets.py::test_data_loss_is_reported_not_decided",
    U + "test_spark_offsets.py::test_offset_spec_and_resolve",
    U + "test_spark_offsets.py::test_json_round_trip_is_sparks_kafka_format",
    U + "test_spark_batch_decode.py::test_every_codec_keys_values_headers_nulls",
    U + "test_spark_batch_decode.py::test_control_batch_is_skipped_but_counted",
    SINK + "test_a_replayed_committed_batch_writes_nothing",
    SINK + "test_a_task_that_died_with_its_transaction_open_is_fenced_and_retried_once")

SIM_CLEAN = (SIM + "test_seeds_are_clean", SIM + "test_every_fault_kind_appears_and_stays_clean",
             SIM + "test_each_mutation_is_caught_at_its_seed")

TWINS: dict[str, tuple[str, ...]] = {
    # ================================================================ tests/cluster/
    # DeleteRecords is answered by the leader only; the log start moves and is stored
    "tests/cluster/test_admin_cluster.py::test_delete_records_on_the_leader_only": (
        EPOCH_FOLLOWER,
        U + "test_log_start_offset.py::test_increment_moves_the_start_deletes_segments_and_survives_reopen",
        INT + "test_admin_apis.py::test_delete_records",
        INT + "test_admin_apis.py::test_delete_records_errors_on_the_wire",
        LEADER + "test_fetch_by_a_non_replica_raises_and_changes_nothing"),
    # KIP-320: a consumer's position past the new leader's epoch end is detected as truncation
    "tests/cluster/test_admin_cluster.py::test_kafka_python_detects_truncation_after_an_unclean_election": (
        EPOCHS + "test_end_offset_for_epoch", EPOCHS + "test_diverging_epoch",
        INT + "test_admin_apis.py::test_offset_for_leader_epoch_confluent_detects_truncation",
        CTRL_STATE + "test_unclean_election_when_allowed"),
    # one CreateTopics of several topics: each its own result (an existing name its
    # TOPIC_ALREADY_EXISTS), the others created whole
    "tests/cluster/test_admin_cluster.py::test_one_create_topics_request_of_several_topics": (
        U + "test_topics_and_metadata.py::test_create_topics_off_the_loop_each_topic_all_or_nothing",
        U + "test_topics_and_metadata.py::test_concurrent_creates_of_one_name_and_concurrent_growth"),
    # a deleted topic is gone from every broker and disk; its name starts empty again
    "tests/cluster/test_admin_cluster.py::test_a_deleted_topic_leaves_every_broker_and_its_name_can_be_used_again": (
        CTRL_STATE + "test_topic_deletion_stops_its_decisions_and_ends_its_reassignments",
        U + "test_controller_service.py::test_a_reassignment_is_decided_by_the_pure_controller_assignment_first",
        CTRL_STATE + "test_topic_deleted_leaves_no_trace_and_ignores_late_answers"),
    # issue 23 item 5: internal topics keep cleanup.policy=compact and their partition count
    "tests/cluster/test_admin_cluster.py::test_internal_topics_refuse_damaging_changes_on_a_cluster": (
        INT + "test_internal_topics.py::test_internal_topics_refuse_damaging_changes_and_keep_commits",
        INT + "test_internal_topics.py::test_client_cannot_create_an_internal_topic_without_compaction"),
    # issue 27: dynamic default broker configs and group configs reach every broker
    # (/config/brokers/<default>, /config/groups/<group>, announced on /config/changes)
    "tests/cluster/test_admin_cluster.py::test_dynamic_default_broker_configs_reach_every_broker": (
        U + "test_zk_store_rules.py::test_entity_configs_are_announced_and_applied_by_the_brokers_they_concern",
        INT + "test_dynamic_configs.py::test_message_max_bytes_changes_at_runtime_and_survives_a_restart",
        INT + "test_dynamic_configs.py::test_describe_reports_sources_synonyms_and_read_only"),
    # a replica checks the request's leader epoch (FENCED / UNKNOWN_LEADER_EPOCH) first
    "tests/cluster/test_admin_cluster.py::test_a_follower_checks_the_leader_epoch_before_leadership": (
        INT + "test_inproc_epochs.py::test_the_epoch_rule",
        INT + "test_inproc_epochs.py::test_requests_naming_a_newer_epoch_are_unknown_and_current_ones_served",
        EPOCH_FOLLOWER, LEADER + "test_check_follower_fetch"),
    # R-REP-2..8, R-PROD-2: random faults under load lose and duplicate nothing acknowledged
    "tests/cluster/test_chaos.py": (*SIM_CLEAN, SIM + "test_shrunk_schedule_replays_the_same_failure"),
    # the README's one-broker-per-machine command: the broker registers its advertised
    # listeners in Kafka's znode format; its flags override server.properties
    "tests/cluster/test_cluster_command.py::test_readme_broker_on_three_machines_registers_as_written": (
        U + "test_zk_layout.py::test_broker_znode_endpoint_and_rack",
        U + "test_zk_layout.py::test_broker_znode_with_several_listeners",
        U + "test_kafka_properties.py::test_listeners_set_host_and_port_unless_given"),
    # issue 26 defect 3: topics describe answers from the live brokers in seconds, a
    # partition without a leader shown as such
    "tests/cluster/test_cli_failover.py::test_topics_describe_answers_from_the_live_brokers": (
        U + "test_topic_describe.py::test_a_partition_without_a_leader_is_shown_as_such",
        U + "test_topic_describe.py::test_describe_skips_a_dead_bootstrap_address"),
    # issue 26 defect 5: the running cluster's stop-broker/restart-broker, ports in use
    # named (the README's block as written and the Ctrl-C timing are the process's own)
    "tests/cluster/test_cluster_command.py::test_cluster_command_runs_three_brokers_and_stops_on_ctrl_c": (
        U + "test_cluster_control.py::test_restart_and_stop_reach_the_running_cluster",
        U + "test_cluster_control.py::test_no_running_cluster_is_one_line",
        U + "test_cluster_control.py::test_cluster_refuses_ports_in_use_naming_them",
        U + "test_controlled_shutdown.py::test_nothing_to_move_when_every_other_replica_is_shutting_down_too",
        U + "test_controlled_shutdown.py::test_a_request_that_times_out_says_so",
        U + "test_controlled_shutdown.py::test_no_zookeeper_no_retries"),
    # issue 26: the console through a coordinator's kill and restart: the outage on the
    # affected group only, no phantom throughput, back within one sample
    "tests/cluster/test_web_console_cluster.py::test_console_through_a_coordinator_kill_and_restart": (
        INT + "test_web_console_outage.py::test_groups_are_sampled_from_their_coordinator",
        INT + "test_web_console_outage.py::test_a_silent_broker_costs_only_its_own_groups",
        U + "test_webconsole_model.py::test_no_phantom_throughput_across_a_leader_change",
        U + "test_webconsole_model.py::test_an_outage_shows_on_the_groups_it_concerns_only"),
    # R-SPARK-3/4 on a cluster: the source follows leader changes, nothing lost or doubled
    "tests/cluster/test_demo_cluster.py": (
        U + "test_spark_list_offsets.py::test_first_offsets_wait_for_a_partition_without_a_leader",
        U + "test_spark_list_offsets.py::test_a_micro_batch_leaves_a_leaderless_partition_for_the_next",
        U + "test_spark_offsets.py::test_audit_compare", SIM + "test_seeds_are_clean"),
    # R-REP-3: a lagging follower leaves the ISR after the lag time and rejoins when caught up
    "tests/cluster/test_failover.py::test_paused_follower_leaves_isr_and_rejoins": (
        LEADER + "test_follower_not_caught_up_for_the_lag_time_is_removed",
        LEADER + "test_follower_that_reached_the_high_watermark_joins",
        LEADER + "test_follower_below_the_high_watermark_does_not_join"),
    # R-REP-6: acks=all below min.insync.replicas is NOT_ENOUGH_REPLICAS; reads go on
    "tests/cluster/test_failover.py::test_two_of_three_down_refuses_acks_all_and_serves_reads": (
        LEADER + "test_acks_all_below_min_insync_after_the_append",
        LEADER + "test_acks_all_waits_for_the_high_watermark",
        CTRL + "test_dead_follower_leaves_isr_and_new_partitions_get_states"),
    # R-REP-8: unclean off: no out-of-sync leader, the partition waits for its last ISR member
    "tests/cluster/test_failover.py::test_unclean_off_keeps_partition_offline_until_the_leader_returns": (
        CTRL + "test_no_live_isr_member_keeps_partition_offline_unless_unclean",
        CTRL_STATE + "test_no_live_in_sync_replica_goes_offline_keeping_the_last_isr",
        CTRL + "test_elections_never_pick_out_of_sync_replicas_when_clean"),
    # R-REP-8: unclean on: exactly the old leader's unreplicated tail is lost and truncated
    "tests/cluster/test_failover.py::test_unclean_on_elects_an_out_of_sync_replica_and_loses_exactly_its_gap": (
        CTRL_STATE + "test_unclean_election_when_allowed",
        FOLLOWER + "test_diverged_follower_truncates_and_converges",
        EPOCHS + "test_truncation"),
    # R-REP-7 (KIP-101/279): after failovers every replica's log is byte-identical
    "tests/cluster/test_failover.py::test_two_quick_failovers_leave_identical_logs": (
        FOLLOWER + "test_diverged_follower_truncates_and_converges",
        FOLLOWER + "test_truncating_at_the_log_end_drops_an_epoch_never_written_in",
        EPOCHS + "test_repeated_truncation_reaches_the_common_prefix", SIM + "test_seeds_are_clean"),
    # R-REP-9: a new controller (higher epoch) takes over; a deposed one's writes are fenced
    "tests/cluster/test_failover.py::test_controller_failover_and_elections_continue": (
        CTRL_STATE + "test_deposed_epoch_is_on_every_write",
        CTRL_STATE + "test_startup_creates_new_partitions_then_sends_leader_and_isr",
        SIM + "test_every_fault_kind_appears_and_stays_clean"),
    # issue 21: a restarted broker never leads at an epoch its earlier process may have led
    # (no high watermark below one served); the controller handles a bounce as a failure
    # then a startup (a new leader epoch)
    "tests/cluster/test_failover.py::test_a_restarted_leader_never_serves_a_lower_high_watermark": (
        SIM + "test_a_restarted_broker_leading_from_a_reread_moves_the_hw_back",
        CTRL + "test_a_bounced_leader_is_a_failure_then_a_startup",
        CTRL + "test_a_registration_newer_than_the_state_is_a_bounce_nobody_saw"),
    # issue 21, defect 5: every state write is announced in its own transaction (brokers
    # follow one notification list, no watch per partition)
    "tests/cluster/test_watches.py": (
        U + "test_zk_store_rules.py::test_new_states_of_a_deleted_topic_do_not_bring_its_znode_back",),
    # a leader whose session expired is fenced, rejoins as follower, loses nothing acked
    "tests/cluster/test_failover.py::test_session_expiry_fences_the_leader": (
        CTRL_STATE + "test_bounced_broker_is_a_failure_then_a_start",
        CTRL_STATE + "test_write_refused_rereads_and_decides_again",
        SIM + "test_every_fault_kind_appears_and_stays_clean"),
    # controlled shutdown moves leadership away before the broker leaves
    "tests/cluster/test_failover.py::test_controlled_shutdown_moves_leadership_before_exit": (
        CTRL_STATE + "test_controlled_shutdown_moves_leadership_and_leaves_isrs",
        CTRL + "test_controlled_shutdown_moves_leadership_and_shrinks_isr"),
    # preferred leader election moves leadership back to the first assigned replica
    "tests/cluster/test_failover.py::test_preferred_leader_comes_back": (
        CTRL + "test_preferred_election",
        "tests/unit/replication/test_controller_state.py::"
        "test_preferred_election_on_request_and_its_outcomes",),
    # KIP-455: a reassignment catches the new replica up, then drops the old one
    "tests/cluster/test_failover.py::test_reassignment_moves_a_partition_to_another_broker": (
        CTRL + "test_reassignment_phases", LEADER + "test_reassignment_adds_followers_unknown",
        CTRL_STATE + "test_reassignment_writes_the_assignment_first_and_completes_once_the_target_is_in_sync",
        U + "test_controller_service.py::test_a_reassignment_is_decided_by_the_pure_controller_assignment_first"),
    # R-REP-4: only a replica's fetch can move the high watermark
    "tests/cluster/test_failover.py::test_fetch_as_a_non_replica_cannot_move_the_high_watermark": (
        LEADER + "test_fetch_by_a_non_replica_raises_and_changes_nothing",
        LEADER + "test_high_watermark_ignores_followers_outside_the_isr"),
    # acks=all produce requests wait for the high watermark without holding each other up
    "tests/cluster/test_failover.py::test_produce_requests_pipeline_on_one_connection": (
        INT + "test_inproc_pipelining.py::test_pipelined_produce_requests_are_applied_and_answered_in_order",
        LEADER + "test_acks_all_waits_for_the_high_watermark"),
    # R-GRP-2: the new coordinator loads the group from __consumer_offsets and members go on
    "tests/cluster/test_groups_cluster.py": (
        U + "test_group_coordinator.py::test_group_metadata_record_written_and_loaded",
        U + "test_group_coordinator.py::test_consumer_group_is_rebuilt_from_its_records",
        U + "test_consumer_group.py::test_restore_equals_original_and_members_carry_on_without_rebalance",
        U + "test_group_hashing.py::test_partition_for_uses_kafkas_abs"),
    # issue 25 (KIP-932): a new leader reloads a share-partition from __share_group_state;
    # nothing acknowledged is delivered again, nothing is lost
    "tests/fault/test_share_broker_kill.py": (
        INT + "test_share_fetch.py::test_state_survives_a_restart",
        INT + "test_share_coordinator.py::test_state_survives_a_restart"),
    "tests/cluster/test_share_cluster.py": (
        INT + "test_share_fetch.py::test_state_survives_a_restart",
        INT + "test_share_coordinator.py::test_state_survives_a_restart",
        INT + "test_share_consumers.py::test_a_killed_consumers_records_go_to_another"),
    # issue 13: controller, readiness, under-replicated partitions and ISR shrink/expand metrics
    "tests/cluster/test_metrics_cluster.py": (
        U + "test_metrics.py::test_exposition_uses_the_jmx_exporter_names",
        U + "test_metrics.py::test_health_ready_and_not_ready",
        INT + "test_metrics.py::test_health_ready_and_unknown_paths",
        U + "test_metrics_isr.py::test_isr_shrinks_and_expansions_are_counted_once_each",
        LEADER + "test_follower_not_caught_up_for_the_lag_time_is_removed",
        # issue 23 item 8: a deleted topic's series leave /metrics, its name counts from 0
        INT + "test_metrics.py::test_deleted_topics_leave_no_series"),
    # issue 21: network partitions heal writable with nothing acknowledged lost or doubled
    "tests/cluster/test_network_partitions.py::test_partitions_heal_writable_with_nothing_lost_or_duplicated": SIM_CLEAN,
    # KIP-841: a broker shutting down is not taken back into ISRs
    "tests/cluster/test_network_partitions.py::test_a_controller_shutting_down_is_not_taken_back_into_isrs": (
        LEADER + "test_a_follower_whose_broker_is_not_eligible_is_not_taken_back",
        CTRL_STATE + "test_controlled_shutdown_moves_leadership_and_leaves_isrs"),
    # R-REP-1/3: replicas are the leader's log byte for byte; metadata agrees
    "tests/cluster/test_replication.py::test_rf3_topic_replicates_byte_for_byte": (
        FOLLOWER + "test_follower_log_is_byte_identical_to_the_leaders",
        CTRL + "test_assignment_distinct_and_leaders_balanced"),
    # R-REP-5, R-PROD-2: killing each leader in turn loses no acknowledged record
    "tests/cluster/test_replication.py::test_kill_leader_of_every_partition_in_turn": (
        *SIM_CLEAN, CTRL + "test_leader_failure_elects_first_live_isr_replica_in_assignment_order",
        FOLLOWER + "test_follower_deduplicates_as_the_leader_would"),
    # R-REP-3: a caught-up follower out of the ISR rejoins on its next fetch
    "tests/cluster/test_replication.py::test_caught_up_follower_taken_out_of_the_isr_rejoins_without_new_records": (
        LEADER + "test_follower_that_reached_the_high_watermark_joins",
        LEADER + "test_a_follower_at_the_log_end_is_never_out_of_sync"),
    # issue 12: inter-broker SASL_SSL listener, ACLs and SCRAM users the same on every broker
    "tests/cluster/test_security_cluster.py": (
        U + "test_security_core.py::test_listeners_and_the_inter_broker_one",
        U + "test_acl_storage.py::test_zk_acl_json_is_kafkas",
        U + "test_acl_storage.py::test_zk_change_notifications",
        U + "test_acl_storage.py::test_zk_user_config_and_change",
        U + "test_security_core.py::test_scram_with_scramps_client"),
    # issue 10, R-PROD-2: markers reach every leader; exactly once across coordinator and
    # leader kills (fencing, timeouts, the transaction log rebuilt)
    "tests/cluster/test_transactions_cluster.py": (
        U + "test_txn_coordinator.py::test_commit_path_prepare_markers_complete",
        U + "test_txn_coordinator.py::test_random_histories_keep_kafkas_invariants_and_the_log_rebuilds_them",
        U + "test_txn_coordinator.py::test_a_second_producer_fences_the_first_and_aborts_its_transaction",
        U + "test_log_transactions.py::test_a_follower_tracks_the_leaders_transactions",
        REP + "test_read_committed.py::test_fetch_starting_inside_an_aborted_transaction_names_it",
        INT + "test_transactions.py::test_commit_and_abort_as_each_isolation_level_sees_them",
        SIM + "test_transactions_commit_abort_time_out_and_resume_after_coordinator_failover"),
    # issue 27, R-PROD-2: the README's Quix Streams windowed count stays exactly once when
    # a broker dies (a consume-transform-produce loop killed and fenced; aborted records
    # invisible to read_committed)
    "tests/cluster/test_quix_example.py": (
        INT + "test_transactions.py::test_killed_consume_transform_produce_is_exactly_once",
        INT + "test_transactions.py::test_a_second_producer_fences_the_first",
        INT + "test_transactions.py::test_commit_and_abort_as_each_isolation_level_sees_them",
        SIM + "test_transactions_commit_abort_time_out_and_resume_after_coordinator_failover"),
    # ================================================================ tests/fault/
    # R-LOG-4, R-LOG-6: a crash at any step of a compaction leaves a readable log with the
    # latest value per key; leftover .cleaned/.swap files are resolved
    "tests/fault/test_compaction_crash.py": (
        U + "test_cleaner.py::test_a_crash_at_any_point_leaves_a_readable_log",
        U + "test_cleaner.py::test_leftover_cleaned_and_swap_files_from_other_runs",
        U + "test_cleaner.py::test_latest_record_per_key_kept_with_original_offsets",
        U + "test_cleaner.py::test_tombstones_dropped_after_delete_retention"),
    # R-REL-6: an idempotent sink / offset store applies each record once across a crash
    "tests/fault/test_consumer_kill.py": (
        U + "test_reliable_property.py::test_offset_store_start_offset_is_the_contiguous_processed_prefix",
        U + "test_reliable_property.py::test_committed_offsets_never_pass_unprocessed_records",
        U + "test_offset_manager.py::test_seed_000_picture_exactly"),
    # issue 8 item 3: one broker per data dir (an flock), no stale lock after kill -9
    "tests/fault/test_data_dir_lock.py::test_second_broker_process_on_a_locked_data_dir_is_refused": (
        U + "test_data_dir.py::test_a_second_lock_on_a_locked_dir_is_refused_and_a_release_frees_it",),
    "tests/fault/test_data_dir_lock.py::test_lock_is_released_by_kill_9": (
        U + "test_data_dir.py::test_a_lock_whose_holder_died_is_no_stale_lock",),
    "tests/fault/test_data_dir_lock.py::test_embedded_broker_start_stop_start_and_a_second_one_refused": (
        U + "test_data_dir.py::test_a_second_lock_on_a_locked_dir_is_refused_and_a_release_frees_it",
        U + "test_topics_and_metadata.py::test_embedded_broker_stop_after_a_failed_start_is_quiet"),
    # issue 8 item 13: a data dir whose parent is a file is reported as such
    "tests/fault/test_data_dir_lock.py::test_data_dir_whose_parent_is_a_file": (
        U + "test_data_dir.py::test_a_data_dir_whose_parent_is_a_file_says_so",),
    # issue 8 item 4, R-LOG-4: a delete interrupted anywhere leaves the topic whole or gone;
    # a re-created topic never adopts old files
    "tests/fault/test_delete_crash.py::test_kill_9_during_delete_of_a_large_topic_then_recreate_sees_no_old_record": (
        U + "test_topics_and_metadata.py::test_leftover_directories_are_not_adopted",
        U + "test_data_dir.py::test_a_directory_of_another_topic_id_is_not_adopted"),
    "tests/fault/test_delete_crash.py::test_kill_9_at_each_step_of_a_delete_then_recreate_sees_no_old_record": (
        U + "test_topics_and_metadata.py::test_leftover_directories_are_not_adopted",
        U + "test_data_dir.py::test_a_directory_of_another_topic_id_is_not_adopted"),
    "tests/fault/test_delete_crash.py::test_start_removes_strays_and_never_adopts_another_topics_files": (
        U + "test_topics_and_metadata.py::test_leftover_directories_are_not_adopted",
        U + "test_data_dir.py::test_a_directory_of_another_topic_id_is_not_adopted"),
    "tests/fault/test_delete_crash.py::test_open_of_a_directory_with_another_topic_id_starts_empty": (
        U + "test_data_dir.py::test_a_directory_of_another_topic_id_is_not_adopted",),
    # issue 8 item 7: internal topics cannot be deleted by clients
    "tests/fault/test_delete_crash.py::test_delete_topics_refuses_internal_topics": (
        RESTART + "test_delete_topics_refuses_internal_topics",),
    # issue 8 item 2, R-LOG-4: a failed write (ENOSPC) is undone; nothing acknowledged is lost
    "tests/fault/test_disk_full.py": (
        LOG + "test_failed_log_write_is_undone_and_later_appends_stay_readable",
        LOG + "test_failed_batch_of_a_multi_batch_request_undoes_the_whole_request",
        LOG + "test_failed_index_write_undoes_the_append",
        U + "test_topics_and_metadata.py::test_failed_metadata_save_leaves_no_half_created_topic"),
    # R-GRP-6/7: committed offsets and the group's members survive a restart
    "tests/fault/test_group_restart.py": (
        RESTART + "test_a_restart_keeps_records_topic_ids_commits_and_the_log_start",
        U + "test_group_coordinator.py::test_group_metadata_record_written_and_loaded",
        U + "test_classic_group.py::test_static_member_rejoin_without_rebalance_and_old_id_fenced"),
    # R-PROTO-7 across a restart: retried batches get their original offsets, a gap is refused
    "tests/fault/test_idempotent_kill.py": (
        U + "test_state_files.py::test_a_retried_last_batch_is_still_a_duplicate_after_a_restart",
        U + "test_producer_state.py::test_in_sequence_batches_and_duplicates",
        U + "test_producer_state.py::test_state_rebuilds_from_headers_and_truncates",
        INT + "test_wire_behaviour.py::test_idempotent_producer_dedupes_and_rejects_gaps_across_a_restart"),
    # issue 8 item 9, R-NF-1: open segment files are capped below the fd limit
    "tests/fault/test_many_partitions.py": (
        LOG + "test_open_segment_files_are_capped", LOG + "test_lazy_file_is_never_closed_under_a_reader"),
    # issue 14: nothing is committed past an unprocessed record when a lane's worker dies
    "tests/fault/test_process_lane_kill.py": (
        U + "test_offset_manager.py::test_committing_past_an_unprocessed_offset_raises_and_changes_nothing",
        U + "test_reliable_property.py::test_committed_offsets_never_pass_unprocessed_records",
        U + "test_reliable_lanes.py::test_a_range_batch_with_a_failed_root_commits_up_to_it_and_replays_it"),
    # R-LOG-4: a restart keeps everything; recovery truncates a torn or garbage tail at the
    # first invalid batch; damaged indexes are rebuilt
    "tests/fault/test_restart_and_corruption.py::test_graceful_restart_keeps_everything": (
        RESTART + "test_a_restart_keeps_records_topic_ids_commits_and_the_log_start",
        LOG + "test_read_matches_a_simple_model"),
    "tests/fault/test_restart_and_corruption.py::test_kill_9_during_produce_loses_no_acknowledged_record": (
        LOG + "test_recovery_truncates_torn_batch", LOG + "test_recovery_truncates_a_garbage_tail"),
    "tests/fault/test_restart_and_corruption.py::test_garbage_over_the_tail_of_the_active_segment": (
        LOG + "test_recovery_truncates_a_garbage_tail",
        LOG + "test_garbage_in_a_middle_segment_drops_later_segments"),
    "tests/fault/test_restart_and_corruption.py::test_truncated_and_deleted_index_files_are_rebuilt": (
        LOG + "test_index_damage_is_rebuilt",),
    # issue 8 item 13: one unreadable partition is KAFKA_STORAGE_ERROR; the rest is served
    "tests/fault/test_unreadable_partition.py": (
        RESTART + "test_a_broker_starts_and_serves_with_one_unreadable_partition",
        U + "test_topics_and_metadata.py::test_a_log_that_cannot_open_leaves_nothing"),
    # ================================================================ tests/integration/
    # DeleteRecords' moved log start is stored and survives a restart
    INT + "test_admin_apis.py::test_delete_records_survives_a_restart": (
        RESTART + "test_a_restart_keeps_records_topic_ids_commits_and_the_log_start",
        U + "test_log_start_offset.py::test_increment_moves_the_start_deletes_segments_and_survives_reopen",
        U + "test_log_start_offset.py::test_open_deletes_segments_below_a_stored_start"),
    # R-SPARK-4: the audit's verdict: lost and duplicated per window, ok only when both are 0
    INT + "test_audit_exit.py": (U + "test_spark_offsets.py::test_audit_compare",),
    # R-PROTO-5: a lagging group's lag as headrace reports it (Burrow reads the same APIs)
    INT + "test_burrow.py": (
        CLI + "test_groups_describe_lag_and_reset_offsets",
        INT + "test_offsets.py::test_admin_list_describe_delete"),
    # issue 2 §5: broker start-up errors and topics administration from the command line
    INT + "test_cli.py::test_port_taken_exits_non_zero_with_a_clear_message": (
        CLI + "test_port_taken_and_unusable_data_dir_are_refused_with_the_reason",),
    INT + "test_cli.py::test_unusable_data_dir_exits_non_zero": (
        CLI + "test_port_taken_and_unusable_data_dir_are_refused_with_the_reason",
        U + "test_data_dir.py::test_a_data_dir_whose_parent_is_a_file_says_so"),
    INT + "test_cli.py::test_bad_config_exits_non_zero": (CLI + "test_bad_broker_config_names_the_key",),
    INT + "test_cli.py::test_topics_commands": (CLI + "test_topics_commands",),
    # issue 13: one line and exit 3 when nothing listens, exit 2 on bad input, read-only
    # commands create nothing, help for every command, -b/--bootstrap-server/$HEADRACE_BOOTSTRAP,
    # --format json, the admin verbs (the module runs a process per call); --command-config's
    # TLS and SASL through the same listeners as the security tests
    INT + "test_cli_ux.py": (
        CLI + "test_nothing_listening_is_one_line_and_exit_3", CLI + "test_verbose_adds_the_reason",
        CLI + "test_bad_input_is_one_line_exit_2_no_traceback",
        CLI + "test_every_command_has_help_without_rest_markup_and_shows_defaults",
        CLI + "test_read_only_commands_create_nothing", CLI + "test_bootstrap_option_spellings",
        CLI + "test_describe_offsets_sizes_and_add_partitions", CLI + "test_cluster_info_and_configs",
        CLI + "test_listing_commands_speak_json", CLI + "test_groups_describe_lag_and_reset_offsets",
        U + "test_security_core.py::test_jaas_options",
        INT + "test_security.py::test_every_client_produces_and_consumes_over_every_mode"),
    # R-GRP-6, R-PROTO-5: quotas set through the CLI survive a restart; throttles per KIP-219
    INT + "test_client_quotas.py": (
        U + "test_quotas.py::test_sqlite_quotas_survive_a_reopen",
        U + "test_quotas.py::test_throttle_time_is_kip219s",
        U + "test_quotas.py::test_a_client_that_waits_out_throttles_stays_within_its_quota",
        U + "test_quotas.py::test_a_greedy_client_converges_on_its_quota",
        INT + "test_client_quotas.py::test_alter_and_describe_round_trip"),
    # issue 13: produce/consume round trips with keys, headers, codecs, JSON; one-line errors
    INT + "test_console.py": (
        CLI + "test_produce_and_consume_keys_headers_and_template",
        CLI + "test_produce_compressed_and_consume_a_count",
        CLI + "test_missing_partition_and_unreachable_broker_are_one_line",
        CLI + "test_read_only_commands_create_nothing"),
    # R-SPARK-3/4, issue 10 item 4: the demo's audit finds nothing lost or duplicated
    INT + "test_demo.py::test_demo_runs_end_to_end_and_its_audit_finds_no_loss_or_duplicates": (
        U + "test_spark_offsets.py::test_audit_compare",
        INT + "test_spark_source_inproc.py::test_micro_batches_read_every_record_once_in_order",
        SINK + "test_a_replayed_committed_batch_writes_nothing",
        U + "test_spark_offsets.py::test_plan_end_caps_by_limit_and_available_now_target"),
    INT + "test_demo.py::test_audit_command_checks_the_result_topics_from_before_the_first_run": (
        U + "test_spark_offsets.py::test_audit_compare", U + "test_spark_offsets.py::test_json_round_trip_is_sparks_kafka_format"),
    # R-REL-6: the reliable word count counts every word exactly once
    INT + "test_examples.py": (
        U + "test_acker.py::test_split_sentence_tree_completes_exactly_at_the_last_ack",
        U + "test_reliable_property.py::test_committed_offsets_never_pass_unprocessed_records"),
    # R-GRP-3: a member that stops heartbeating is removed after session.timeout.ms
    INT + "test_groups.py::test_killed_member_partitions_move_after_session_timeout": (
        U + "test_classic_group.py::test_session_timeout_removes_member_and_rebalances",),
    # issue 3 §5: groups list/describe/lag/reset-offsets, an unknown group is one line
    INT + "test_groups_cli.py": (CLI + "test_groups_describe_lag_and_reset_offsets",),
    # KIP-848: session timeout removes a member; the group is rebuilt from its records
    INT + "test_kip848.py::test_killed_member_partitions_move_after_the_session_timeout": (
        U + "test_consumer_group.py::test_session_timeout_removes_member_and_reassigns",),
    INT + "test_kip848.py::test_consumer_group_survives_a_broker_restart": (
        U + "test_consumer_group.py::test_restore_equals_original_and_members_carry_on_without_rebalance",
        U + "test_consumer_group.py::test_random_histories_restore_to_the_same_group"),
    # R-GRP-6: committed offsets are in __consumer_offsets and survive a restart
    INT + "test_offsets.py::test_offsets_survive_broker_restart": (
        RESTART + "test_a_restart_keeps_records_topic_ids_commits_and_the_log_start",
        U + "test_group_coordinator.py::test_assign_mode_commit_round_trips_through_records"),
    # issue 12: a producer_byte_rate quota holds a client to its rate
    INT + "test_quota_produce_rate.py": (
        U + "test_quotas.py::test_byte_rates_use_a_token_bucket",
        U + "test_quotas.py::test_a_greedy_client_converges_on_its_quota",
        U + "test_quotas.py::test_a_client_that_waits_out_throttles_stays_within_its_quota"),
    # issue 22: the fast tier selects the pure cores and none of the slow tier
    INT + "test_readme_fast_tier.py": (
        U + "test_suite_policy.py::test_the_tier_rule_keeps_unit_tests_fast_and_marks_heavy_ones_slow",),
    # R-REL-4/5: nothing lost across a consumer kill or a rebalance; commits never pass an
    # unprocessed record; replays bounded by max_uncommitted_offsets
    INT + "test_reliable.py": (
        U + "test_offset_manager.py::test_committing_past_an_unprocessed_offset_raises_and_changes_nothing",
        U + "test_offset_manager.py::test_max_uncommitted_offsets_pauses_until_commits_catch_up",
        U + "test_offset_manager.py::test_revoke_returns_the_final_commit_and_drops_state",
        U + "test_reliable_property.py::test_committed_offsets_never_pass_unprocessed_records",
        U + "test_kip848_reconcile.py::test_member_revoking_gets_no_free_partition_until_it_acknowledges"),
    # R-NF-3: half-sent frames and unread responses are bounded by the shared memory pool
    INT + "test_resource_limits.py::test_half_sent_frames_are_bounded_by_the_shared_memory_pool": (
        U + "test_memory_pool.py::test_reservations_up_to_the_capacity_then_waiters_in_order",
        U + "test_memory_pool.py::test_cancel_forgets_a_waiter_and_returns_a_grant",
        INT + "test_bad_input.py::test_a_vanished_half_frame_gives_its_memory_and_slot_back"),
    INT + "test_resource_limits.py::test_pipelined_fetches_never_read_are_bounded_and_dropped_on_close": (
        INT + "test_resource_limits.py::test_queued_requests_of_a_closed_connection_are_dropped_but_produce_is_applied",
        INT + "test_resource_limits.py::test_queued_requests_across_connections_never_exceed_the_limit"),
    # issue 12: OAUTHBEARER, SCRAM, PLAIN, mTLS, re-authentication (KIP-368)
    INT + "test_security.py::test_oauthbearer_with_the_jwks_fetched_over_http": (
        U + "test_security_core.py::test_oauthbearer",
        U + "test_security_core.py::test_made_up_key_ids_do_not_make_the_broker_fetch_the_jwks_each_time"),
    INT + "test_security.py::test_unsecured_oauthbearer_takes_unsigned_tokens_only": (
        U + "test_security_core.py::test_oauthbearer",
        INT + "test_security.py::test_expired_and_foreign_tokens_are_refused"),
    INT + "test_security.py::test_kafka_python_over_ssl_mtls_and_sasl": (
        INT + "test_security.py::test_every_client_produces_and_consumes_over_every_mode",),
    INT + "test_security.py::test_scram_users_created_through_the_admin_api_authenticate": (
        U + "test_security_core.py::test_scram_with_scramps_client",
        INT + "test_acls.py::test_scram_users_through_admin_client_and_cli"),
    INT + "test_security.py::test_wrong_password_and_unknown_user_are_refused": (
        INT + "test_security.py::test_a_wrong_password_or_unknown_user_fails_on_the_wire_and_closes",
        U + "test_security_core.py::test_plain", U + "test_security_core.py::test_scram_with_scramps_client"),
    INT + "test_security.py::test_untrusted_or_missing_client_certificates_are_refused": (
        INT + "test_security.py::test_mutual_tls_answers_only_a_certificate_of_the_trusted_ca",
        INT + "test_acls_authenticated.py::test_mtls_principals_from_rules_and_from_the_dn"),
    INT + "test_security.py::test_confluent_kafka_reauthenticates_and_keeps_consuming": (
        INT + "test_security.py::test_session_lifetime_and_reauthentication",),
    # issue 12 item 5: a SASL user held to its ACLs (the README's security walk-through)
    INT + "test_security_quickstart.py": (
        INT + "test_acls_authenticated.py::test_sasl_user_reads_a_not_b",
        INT + "test_acls_authenticated.py::test_commit_needs_read_on_the_group",
        U + "test_acl.py::test_literal_allow_and_principal_host_matching"),
    # issue 11 item 6: Kafka's server.properties are read, overridden, or refused in one line
    INT + "test_server_properties.py": (
        U + "test_kafka_properties.py::test_listeners_set_host_and_port_unless_given",
        U + "test_kafka_properties.py::test_refused_with_the_reason",
        U + "test_kafka_properties.py::test_no_effect_keys_are_named_once_and_broker_id_is_node_id",
        U + "test_kafka_properties.py::test_log_dirs_first_holds_the_state_and_the_rest_are_named"),
    # issue 21: the simulation's seeds are clean
    INT + "test_simulate_command.py": (SIM + "test_seeds_are_clean",),
    # issue 23: each attack alone leaves other clients served (the throughput ratio is what
    # only the slow run measures)
    INT + "test_noisy_neighbour.py": (
        INT + "test_hostile_clients.py::test_size_prefixes_alone_do_not_take_the_request_memory_pool",
        INT + "test_hostile_clients.py::test_frames_never_completed_take_no_request_slots",
        INT + "test_hostile_clients.py::test_one_address_cannot_take_every_connection_slot",
        INT + "test_hostile_clients.py::test_password_guessing_is_held_to_one_guess_per_delay",
        INT + "test_txn_verification.py::test_a_partition_never_added_is_refused"),
    # R-SPARK-1/2: offsets planned, every record once per micro-batch plan, data loss reported,
    # restarts resume from the checkpointed offsets; the sink writes keys, values, headers
    INT + "test_spark.py": SPARK_TWINS,
    # test_spark.py's tests moved to modules of their own (one Spark session or demo run
    # each, for pytest-xdist), with the same twins: a job killed with -9 and restarted from
    # its checkpoint (R-SPARK-2, the transactional sink's replay: issue 10 item 3)
    INT + "test_spark_driver_kill.py": SPARK_TWINS,
    # the demo killed with -9 and rerun (issue 10); demo runs of their own (R-SPARK-3/4)
    INT + "test_spark_demo_kill.py": (*SPARK_TWINS, U + "test_spark_offsets.py::test_audit_compare"),
    INT + "test_spark_demo.py": (*SPARK_TWINS, U + "test_spark_offsets.py::test_audit_compare"),
    # issue 10: a replayed batch of the transactional sink adds nothing (fencing, read_committed)
    INT + "test_spark_executor_kill.py": (
        SINK + "test_a_replayed_committed_batch_writes_nothing",
        SINK + "test_a_task_that_died_with_its_transaction_open_is_fenced_and_retried_once",
        U + "test_txn_coordinator.py::test_a_second_producer_fences_the_first_and_aborts_its_transaction",
        REP + "test_read_committed.py::test_fetch_starting_inside_an_aborted_transaction_names_it",
        INT + "test_transactions.py::test_a_second_producer_fences_the_first"),
    # issue 8 item 10: creates at scale are off the loop and one metadata transaction
    INT + "test_topic_scale.py": (
        U + "test_topics_and_metadata.py::test_create_topics_off_the_loop_each_topic_all_or_nothing",
        U + "test_metadata_store.py::test_every_change_is_persisted_incrementally"),
    # issue 10: transactions list/describe; snapshots and txnindexes rebuild the state
    INT + "test_transactions.py::test_cli_lists_and_describes_transactions": (
        U + "test_txn_coordinator.py::test_describe_transactions_v0_decoded_by_hand_as_kio_writes_it",
        INT + "test_transactions.py::test_describe_and_list_transactions_on_the_wire"),
    INT + "test_transactions.py::test_kill_9_with_many_segments_keeps_transactions_through_snapshots_and_txnindexes": (
        U + "test_state_files.py::test_reopen_after_a_crash_scans_only_the_active_segment",
        U + "test_state_files.py::test_txnindex_files_hold_each_segments_aborted_transactions",
        U + "test_log_transactions.py::test_reopen_keeps_an_ongoing_transaction_open"),
    # issue 13: the console's API answers what the clients see, refuses bad and cross-origin
    # requests as JSON errors, survives a broker outage; its lag and rates (pure model)
    INT + "test_web_console.py": (
        WEB + "test_bad_requests_are_json_errors", WEB + "test_bad_posts_are_refused",
        WEB + "test_created_topic_and_its_records_are_shown",
        WEB + "test_a_broker_outage_is_shown_and_survived",
        U + "test_webconsole_model.py::test_lag",
        U + "test_webconsole_model.py::test_append_rate_from_high_watermark_samples",
        U + "test_webconsole_model.py::test_samples_follow_topics_and_groups_and_stay_bounded",
        U + "test_webconsole_model.py::test_sampler_keeps_the_last_snapshot_and_dies_on_a_bug"),
    # issue 27: Faust's own live-broker tests (produce and consume through aiokafka and
    # confluent-kafka) pass against headrace
    INT + "test_faust_suite.py": (
        INT + "test_clients.py::test_round_trip_every_codec",
        INT + "test_groups.py::test_three_members_share_six_partitions"),
    # issue 12: ACLs and SCRAM credentials in Kafka's znodes with change notifications
    INT + "test_zk_acl_store.py": (
        U + "test_acl_storage.py::test_zk_acl_json_is_kafkas",
        U + "test_acl_storage.py::test_zk_change_notifications",
        U + "test_acl_storage.py::test_zk_user_config_and_change"),
    # issue 21 defect 4: the cluster's metadata is followed across ZooKeeper cuts and
    # session expiry (the simulation's zkcut and expire faults)
    INT + "test_zk_reconnect.py": (SIM + "test_every_fault_kind_appears_and_stays_clean",
                                   SIM + "test_seeds_are_clean"),
    # R-REP-9: Kafka's znodes, producer id blocks never reused, conditional state writes
    INT + "test_zk_store.py": (
        U + "test_zk_store_rules.py::test_producer_id_blocks_never_overlap_when_brokers_race",
        U + "test_zk_store_rules.py::test_a_registration_left_by_an_earlier_session_is_waited_out",
        U + "test_zk_store_rules.py::test_new_states_of_a_deleted_topic_do_not_bring_its_znode_back",
        U + "test_zk_layout.py::test_state_znode_is_kafkas",
        U + "test_zk_layout.py::test_topic_znode_round_trip_and_topic_id",
        U + "test_zk_layout.py::test_other_nodes",
        U + "test_topics_and_metadata.py::test_metadata_store_persists_and_reloads",
        CTRL_STATE + "test_write_refused_rereads_and_decides_again"),
}

NO_TWIN: dict[str, str] = {
    INT + "test_demo.py::test_main_job_as_written": "the README's `bash scripts/run.sh` as written",
    INT + "test_demo.py::test_defaults_and_a_work_directory_kept_under_tmpdir":
        "the README's defaults of a real demo run",
    INT + "test_demo.py::test_the_summary_is_readable_and_its_pandas_lines_run":
        "the printed summary of a real demo run",
    INT + "test_readme_quickstart.py": "the README's quickstart, run as written",
    INT + "test_readme_setup.py": "the README's set-up commands in a fresh venv",
}


def covers(key: str, nodeid: str) -> bool:
    """Whether the table entry ``key`` names ``nodeid``: the same test, the test with any
    parameters, or a test of the module (or class) ``key``."""
    return nodeid == key or nodeid.startswith((key + "::", key + "["))
