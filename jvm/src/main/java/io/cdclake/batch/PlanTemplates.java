package io.cdclake.batch;

import java.util.ArrayList;
import java.util.List;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Dataset$;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.Alias;
import org.apache.spark.sql.catalyst.expressions.Attribute;
import org.apache.spark.sql.catalyst.expressions.NamedExpression;
import org.apache.spark.sql.catalyst.plans.logical.LocalRelation;
import org.apache.spark.sql.catalyst.plans.logical.LogicalPlan;
import org.apache.spark.sql.catalyst.plans.logical.Project;
import org.apache.spark.sql.catalyst.types.DataTypeUtils;
import org.apache.spark.sql.types.DataType$;
import org.apache.spark.sql.types.Metadata;
import org.apache.spark.sql.types.StructType;
import scala.Option;
import scala.collection.JavaConverters;
import scala.collection.Seq;

/**
 * A plan built once over a placeholder and used again over each batch's records (app/batch/planner.py): building a
 * topic's decode plan from Python costs hundreds of calls into the JVM and an analysis of every step; substituting
 * the batch's records for the placeholder in the analysed plan costs one call and one analysis.
 */
public final class PlanTemplates {
  private PlanTemplates() {
  }

  /** An empty relation of {@code schema}: the leaf a template is built on. */
  public static Dataset<Row> placeholder(SparkSession spark, StructType schema) {
    Seq<InternalRow> none = JavaConverters.asScalaBuffer(new ArrayList<InternalRow>()).toSeq();
    @SuppressWarnings("unchecked")
    Seq<Attribute> output = (Seq<Attribute>) (Seq<?>) DataTypeUtils.toAttributes(schema);
    return Dataset.ofRows(spark, new LocalRelation(output, none, false));
  }

  /**
   * {@code template}'s plan with {@code input}'s plan in place of {@code placeholder}'s: the placeholder's columns
   * keep their identities (a projection of the input's columns under them), so every step above reads the input.
   *
   * @throws IllegalArgumentException the input's columns are not the placeholder's (names, types, nullability), or
   *     the template is not built on the placeholder
   */
  public static Dataset<Row> substitute(Dataset<Row> template, Dataset<Row> placeholder, Dataset<Row> input) {
    LogicalPlan leaf = placeholder.logicalPlan();
    LogicalPlan source = input.logicalPlan();
    Seq<Attribute> wanted = leaf.output();
    Seq<Attribute> given = source.output();
    if (wanted.size() != given.size()) {
      throw new IllegalArgumentException("the input has " + given.size() + " columns, the placeholder "
          + wanted.size());
    }
    List<NamedExpression> bridge = new ArrayList<>();
    Seq<String> noKeys = JavaConverters.asScalaBuffer(new ArrayList<String>()).toSeq();
    for (int i = 0; i < wanted.size(); i++) {
      Attribute want = wanted.apply(i);
      Attribute have = given.apply(i);
      // Names exact, types equal but for nullability, and nothing nullable (at any depth) where the placeholder's is not.
      if (!want.name().equals(have.name())
          || !DataType$.MODULE$.equalsIgnoreCompatibleNullability(have.dataType(), want.dataType())
          || (have.nullable() && !want.nullable())) {
        throw new IllegalArgumentException("input column " + have + " is not the placeholder's " + want);
      }
      bridge.add(new Alias(have, want.name(), want.exprId(), want.qualifier(), Option.<Metadata>empty(), noKeys));
    }
    LogicalPlan bridged = new Project(JavaConverters.asScalaBuffer(bridge).toSeq(), source);
    // Exactly one empty relation of the placeholder's columns, and it the placeholder: a second one (a template
    // reading its input twice gets a copy with other identities) or one inside a subquery would stay empty.
    int[] counts = {0, 0};
    count(template.logicalPlan(), leaf.schema(), wanted, counts);
    if (counts[1] != 1 || counts[0] != 1) {
      throw new IllegalArgumentException(counts[1] == 0 ? "the template is not built on the placeholder"
          : "the template reads its placeholder " + counts[0] + " times; a template must read it once");
    }
    int[] found = {0};
    LogicalPlan plan = replace(template.logicalPlan(), wanted, bridged, found);
    // The template's root is shared by every batch's copy, with the set of Dataset ids Spark tags it with: a copy
    // gets a set of its own, or each batch's Dataset would add its id to the template's set for good.
    plan.unsetTagValue(Dataset$.MODULE$.DATASET_ID_TAG());
    return Dataset.ofRows(input.sparkSession(), plan);
  }

  /** counts[0]: empty relations of {@code schema} in {@code plan} and its subqueries; counts[1]: those of {@code leaf}. */
  private static void count(LogicalPlan plan, StructType schema, Seq<Attribute> leaf, int[] counts) {
    if (plan instanceof LocalRelation && ((LocalRelation) plan).data().isEmpty() && plan.schema().equals(schema)) {
      counts[0]++;
      if (plan.output().equals(leaf)) {
        counts[1]++;
      }
    }
    Seq<LogicalPlan> children = plan.children();
    for (int i = 0; i < children.size(); i++) {
      count(children.apply(i), schema, leaf, counts);
    }
    Seq<LogicalPlan> subqueries = plan.subqueries();
    for (int i = 0; i < subqueries.size(); i++) {
      count(subqueries.apply(i), schema, leaf, counts);
    }
  }

  private static LogicalPlan replace(LogicalPlan plan, Seq<Attribute> leaf, LogicalPlan with, int[] found) {
    if (plan instanceof LocalRelation && plan.output().equals(leaf)) {
      found[0]++;
      return with;
    }
    Seq<LogicalPlan> children = plan.children();
    if (children.isEmpty()) {
      return plan;
    }
    List<LogicalPlan> replaced = new ArrayList<>();
    boolean changed = false;
    for (int i = 0; i < children.size(); i++) {
      LogicalPlan child = children.apply(i);
      LogicalPlan now = replace(child, leaf, with, found);
      changed |= now != child;
      replaced.add(now);
    }
    return changed ? (LogicalPlan) plan.withNewChildren(JavaConverters.asScalaBuffer(replaced).toSeq()) : plan;
  }
}
